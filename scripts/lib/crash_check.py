#!/usr/bin/env python3
"""`kill -9` at random moments of a settings write, an import and a download, then check that
what was there before is intact: the settings file parses and holds the old or the new value
(never a mix, never empty), and the models folder holds either no model of that name or a
complete one that loads (a download's parts may stay in `.downloads/`, and a later download
finishes from them). Prints one JSON summary. Usage:
  crash_check.py PERCH_BINARY MODELS_WITH_QWEN3 GGUF [--rounds 20]
"""
import argparse, json, os, random, re, shutil, signal, subprocess, sys, tempfile, time, tomllib
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("perch"); ap.add_argument("models"); ap.add_argument("gguf")
ap.add_argument("--rounds", type=int, default=20)
a = ap.parse_args()
out = {"settings": [], "import": [], "download": []}

def put(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/perch/config", data=json.dumps(body).encode(),
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

# Download: a server fetching a model from a slow loopback hub is killed mid-download.
import hashlib, http.server, threading
src = os.path.join(a.models, "qwen3")
files = {f: open(os.path.join(src, f), "rb").read() for f in os.listdir(src) if not f.startswith("golden")}

class Hub(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def do_GET(self):
        if self.path.startswith("/api/models/test/dl/revision/"):
            sib = [{"rfilename": f, "size": len(b), "lfs": {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}}
                   for f, b in files.items()]
            body = json.dumps({"sha": "0" * 40, "siblings": sib}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body); return
        name = self.path.rsplit("/", 1)[-1]
        if name not in files:
            self.send_response(404); self.end_headers(); return
        b, start = files[name], 0
        m = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if m:
            start = int(m.group(1))
            self.send_response(206); self.send_header("Content-Range", f"bytes {start}-{len(b) - 1}/{len(b)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(b) - start)); self.send_header("ETag", '"e"'); self.end_headers()
        try:
            for i in range(start, len(b), 32768):  # slow: a kill lands mid-file
                self.wfile.write(b[i:i + 32768]); time.sleep(0.004)
        except OSError:
            pass

hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
threading.Thread(target=hub.serve_forever, daemon=True).start()

def serve(cfg):
    p = subprocess.Popen([a.perch, "serve", "--config", cfg], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))
    raise SystemExit("perch serve did not start")

def start_download(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/perch/downloads", data=b'{"repo": "test/dl"}',
                                 method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()

def loads(models, name):
    run = subprocess.run([a.perch, "--models-dir", models, "run", "--model", name, "--max-tokens", "2", "--raw", "Hi"],
                         capture_output=True, text=True)
    return run.returncode == 0

with tempfile.TemporaryDirectory() as tmp:
    models = os.path.join(tmp, "models")
    shutil.copytree(src, os.path.join(models, "qwen3"))
    cfg = os.path.join(tmp, "perch.toml")
    open(cfg, "w").write(f'models_dir = "{models}"\ndefault_model = "qwen3"\nport = 0\nwarmup_profile = "off"\n'
                         f'load_warmup = false\nscan_hf_cache = false\nprefix_cache_disk_mb = 0\n'
                         f'hub_endpoint = "http://127.0.0.1:{hub.server_address[1]}"\n')
    total = sum(len(b) for b in files.values())
    for r in range(a.rounds):
        p, port = serve(cfg)
        start_download(port)
        time.sleep(random.uniform(0, total / 32768 * 0.004 * 1.2))
        p.send_signal(signal.SIGKILL); p.wait()
        installed = os.path.isdir(os.path.join(models, "dl"))
        parts = sum(len(fs) for _, _, fs in os.walk(os.path.join(models, ".downloads")))
        ok = loads(models, "dl") if installed else True
        out["download"].append({"model": "complete" if installed else "absent", "loads": ok, "staged_files": parts})
        if installed:
            shutil.rmtree(os.path.join(models, "dl"))
    # After the kills, one more download finishes (from the parts left, where there are any).
    p, port = serve(cfg)
    start_download(port)
    for _ in range(600):
        if os.path.isdir(os.path.join(models, "dl")):
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM); p.wait()
    out["download_after_kills_loads"] = loads(models, "dl")
hub.shutdown()

summary = {
    "settings_rounds": len(out["settings"]), "settings_ok": sum(x["ok"] for x in out["settings"]),
    "settings_new_value_kept": sum(x["ok"] and x["after"] != x["before"] for x in out["settings"]),
    "import_rounds": len(out["import"]), "import_ok": sum(x["loads"] for x in out["import"]),
    "import_complete": sum(x["model"] == "complete" for x in out["import"]),
    "import_max_temp_dirs_left": max(len(x["temp_dirs"]) for x in out["import"]),
    "import_seconds": out["import_seconds"],
    "download_rounds": len(out["download"]), "download_ok": sum(x["loads"] for x in out["download"]),
    "download_complete": sum(x["model"] == "complete" for x in out["download"]),
    "download_killed_with_parts_left": sum(x["model"] == "absent" and x["staged_files"] > 0 for x in out["download"]),
    "download_after_kills_loads": out["download_after_kills_loads"],
}
print(json.dumps({"summary": summary, "detail": out}, indent=1))
sys.exit(0 if summary["settings_ok"] == summary["settings_rounds"] and summary["import_ok"] == summary["import_rounds"]
         and summary["download_ok"] == summary["download_rounds"] and summary["download_after_kills_loads"] else 1)
