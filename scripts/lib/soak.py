#!/usr/bin/env python3
"""Soak `perch serve`: N clients for a while, mixing chats, streams, streams cancelled
mid-answer, bad bodies, model switches (two fixture models, one resident at a time, generating
in one batch of up to 4), embeddings (when MODELS_DIR holds the encoder) and, beside them, a
training run started again whenever none is running (a model switch unloads its model and
stops it).

Prints one JSON summary: requests by status and by kind, 5xx other than 503 (must be 0), RSS
at the start and the end, the training runs started, and how the server exited on SIGTERM.
Usage:
  soak.py PERCH_BINARY MODELS_DIR [--seconds 1800] [--clients 8]
"""
import argparse, http.client, json, os, random, signal, subprocess, sys, threading, time

import perch_serve

ap = argparse.ArgumentParser()
ap.add_argument("perch")
ap.add_argument("models")
ap.add_argument("--seconds", type=float, default=1800)
ap.add_argument("--clients", type=int, default=8)
a = ap.parse_args()

proc, port = perch_serve.start(
    a.perch, "--models-dir", a.models, "serve", "--model", "qwen3", "--log-dir", "none",
    "--idle-grace", "0.5", "--max-queue", "16")

def rss_mb():
    return perch_serve.status_mb(proc.pid, "VmRSS:")

MODELS = ["qwen3", "qwen3-mtp"]
ENCODER = "all-minilm-l6-v2"
has_encoder = os.path.isdir(os.path.join(a.models, ENCODER))
def chat(model, stream, n=16):
    return {"model": model, "stream": stream, "max_tokens": n, "temperature": 0.7,
            "messages": [{"role": "user", "content": random.choice(["hi", "Tell me a story.", "x " * 200])}]}
BAD = [b"{not json", b"[]", json.dumps({"model": "qwen3", "messages": "hi"}).encode(),
       json.dumps({"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}).encode(),
       json.dumps({"model": "+" * 5000, "messages": [{"role": "user", "content": "hi"}]}).encode(),
       json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).encode(),
       json.dumps({"model": "qwen3", "prompt": [999999999]}).encode()]

lock = threading.Lock()
statuses, kinds, bad5xx, errors = {}, {}, [], []
def count(status, what):
    kind = what.split(" ")[1] if " " in what else what
    with lock:
        statuses[status] = statuses.get(status, 0) + 1
        kinds.setdefault(kind, {}).setdefault(status, 0)
        kinds[kind][status] += 1
        if status >= 500 and status != 503:
            bad5xx.append((status, what))

def request(method, path, body=None, cancel_after=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if path == "/train" and method == "POST":
        trained.append(r.status)
    if r.status >= 500 and r.status != 503:
        count(r.status, f"{method} {path} {data[:120]!r} -> {r.read()[:300]!r}")
        return
    count(r.status, f"{method} {path}")
    if cancel_after is not None:
        r.read(cancel_after)  # a few bytes of the stream, then hang up
        c.sock.close()
    else:
        r.read()
    c.close()

def client(deadline):
    while time.time() < deadline:
        kind = random.random()
        try:
            if kind < 0.3:
                request("POST", "/v1/chat/completions", chat(random.choice(MODELS), False))
            elif kind < 0.5:
                request("POST", "/v1/chat/completions", chat(random.choice(MODELS), True))
            elif kind < 0.65:
                request("POST", "/v1/chat/completions", chat(random.choice(MODELS), True, 200), cancel_after=200)
            elif kind < 0.8:
                request("POST", random.choice(["/v1/chat/completions", "/v1/completions"]), random.choice(BAD))
            elif kind < 0.86:
                request("POST", "/v1/completions", {"model": random.choice(MODELS), "prompt": "Once", "max_tokens": 8, "logprobs": 2})
            elif kind < 0.9 and has_encoder:
                inputs = [random.choice(["a short note", "def f(x): return x", "word " * 300]) for _ in range(random.randint(1, 8))]
                if random.random() < 0.5:
                    request("POST", "/v1/embeddings", {"model": ENCODER, "input": inputs})
                else:
                    request("POST", "/api/embed", {"model": ENCODER, "input": inputs})
            else:
                request("GET", random.choice(["/health", "/metrics", "/v1/models"]))
        except Exception as e:  # a dropped connection is a failure too
            with lock:
                errors.append(repr(e))

trained = []
def trainer(deadline):
    """A training run on whichever model is loaded, started again whenever none runs."""
    words = " ".join(["baga", "dase", "fagi", "gaso", "kagu", "lasa"] * 100)
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("GET", "/train")
            state = json.loads(c.getresponse().read() or b"{}").get("state")
            c.close()
            if state not in ("starting", "running", "paused"):
                request("POST", "/train", {"text": words, "seq_len": 32, "epochs": 2, "rank": 4,
                                           "share_ppm": 200000})
        except Exception as e:
            with lock:
                errors.append("trainer: " + repr(e))
        time.sleep(10)

request("POST", "/v1/chat/completions", chat("qwen3", False))
start_rss, t0 = rss_mb(), time.time()
threads = [threading.Thread(target=client, args=(t0 + a.seconds,)) for _ in range(a.clients)]
threads.append(threading.Thread(target=trainer, args=(t0 + a.seconds,)))
for t in threads: t.start()
samples = []
while any(t.is_alive() for t in threads):
    time.sleep(5)
    samples.append(round(rss_mb()))
for t in threads: t.join()
end_rss = rss_mb()
proc.send_signal(signal.SIGTERM)
try:
    code = proc.wait(timeout=60)
except subprocess.TimeoutExpired:
    proc.kill(); code = "killed after 60 s"
print(json.dumps({"seconds": round(time.time() - t0), "clients": a.clients,
                  "requests_by_status": dict(sorted(statuses.items())),
                  "by_path": {k: dict(sorted(v.items())) for k, v in sorted(kinds.items())},
                  "training_starts": {str(c): trained.count(c) for c in sorted(set(trained))},
                  "embeddings": has_encoder,
                  "total": sum(statuses.values()), "5xx_not_503": bad5xx[:20], "n_5xx_not_503": len(bad5xx),
                  "client_errors": errors[:20], "n_client_errors": len(errors),
                  "rss_mb_start": round(start_rss), "rss_mb_end": round(end_rss),
                  "rss_mb_max": max(samples or [0]), "exit_on_sigterm": code}, indent=1))
sys.exit(1 if bad5xx or errors else 0)
