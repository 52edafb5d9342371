#!/usr/bin/env python3
"""`kill -9` at random moments of a settings write and of an import, then check that what was
there before is intact: the settings file parses and holds the old or the new value (never a
mix, never empty), and the models folder holds either no model of that name or a complete one
that loads. Prints one JSON summary. Usage:
  crash_check.py PERCH_BINARY MODELS_WITH_QWEN3 GGUF [--rounds 20]
"""
import argparse, json, os, random, re, shutil, signal, subprocess, sys, tempfile, time, tomllib
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("perch"); ap.add_argument("models"); ap.add_argument("gguf")
ap.add_argument("--rounds", type=int, default=20)
a = ap.parse_args()
out = {"settings": [], "import": []}

def put(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/config", data=json.dumps(body).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except Exception:
        pass

# Settings: a server writing its settings file is killed mid-write.
with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "perch.toml")
    base = (f'models_dir = "{a.models}"\ndefault_model = "qwen3"\nport = 0\nwarmup_profile = "off"\n'
            'load_warmup = false\nscan_hf_cache = false\napi_key = ""\n')
    open(cfg, "w").write(base + 'idle_grace_s = 1.0\n')
    for r in range(a.rounds):
        p = subprocess.Popen([a.perch, "serve", "--config", cfg], stderr=subprocess.PIPE, text=True)
        port = None
        for line in p.stderr:
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m: port = int(m.group(1)); break
        before = tomllib.load(open(cfg, "rb"))["idle_grace_s"]
        new = float(r + 2)
        import threading
        t = threading.Thread(target=put, args=(port, {"idle_grace_s": new}))
        t.start()
        time.sleep(random.uniform(0, 0.03))
        p.send_signal(signal.SIGKILL); p.wait(); t.join()
        text = open(cfg).read()
        try:
            after = tomllib.loads(text)["idle_grace_s"]
            ok = after in (before, new) and "api_key" in text
        except Exception as e:
            after, ok = repr(e), False
        out["settings"].append({"before": before, "after": after, "ok": ok})
        stray = [f for f in os.listdir(tmp) if f != "perch.toml"]
        if stray: out["settings"][-1]["stray_files"] = stray

# Import: `perch import` killed at a random moment.
with tempfile.TemporaryDirectory() as tmp:
    models = os.path.join(tmp, "models")
    t0 = time.time()
    subprocess.run([a.perch, "--models-dir", models, "import", a.gguf, "--name", "timing"], check=True,
                   capture_output=True)
    full = time.time() - t0
    shutil.rmtree(os.path.join(models, "timing"))
    for r in range(a.rounds):
        p = subprocess.Popen([a.perch, "--models-dir", models, "import", a.gguf, "--name", "m", "--overwrite"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0, full * 1.1))
        p.send_signal(signal.SIGKILL); finished = p.wait() == 0
        names = sorted(os.listdir(models))
        state = "complete" if "m" in names else "absent"
        ok = True
        if "m" in names:  # a model that is there must load
            run = subprocess.run([a.perch, "--models-dir", models, "run", "--model", "m", "--max-tokens", "2", "--raw", "Hi"],
                                 capture_output=True, text=True)
            ok = run.returncode == 0
        out["import"].append({"killed_at_s": None if finished else "mid", "model": state, "loads": ok,
                              "temp_dirs": [n for n in names if n.startswith(".import-")]})
    out["import_seconds"] = round(full, 1)
summary = {
    "settings_rounds": len(out["settings"]), "settings_ok": sum(x["ok"] for x in out["settings"]),
    "settings_new_value_kept": sum(x["ok"] and x["after"] != x["before"] for x in out["settings"]),
    "import_rounds": len(out["import"]), "import_ok": sum(x["loads"] for x in out["import"]),
    "import_complete": sum(x["model"] == "complete" for x in out["import"]),
    "import_max_temp_dirs_left": max(len(x["temp_dirs"]) for x in out["import"]),
    "import_seconds": out["import_seconds"],
}
print(json.dumps({"summary": summary, "detail": out}, indent=1))
sys.exit(0 if summary["settings_ok"] == summary["settings_rounds"] and summary["import_ok"] == summary["import_rounds"] else 1)
