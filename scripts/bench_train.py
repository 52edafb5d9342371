"""The bench behind scripts/bench-train (stdlib only). See that script for what it measures."""
import argparse, json, os, random, socket, subprocess, sys, threading, time, urllib.error, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT_FILE = "/usr/share/common-licenses/GPL-3"  # real English prose on every Debian machine
# A window queued behind a turn starts the moment that turn's generation ends, while the
# client is still reading the response: overlaps shorter than this are that latency, not
# training slowing the turn.
LATENCY_S = 0.05


def call(base, method, path, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(base + path, method=method, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=timeout) as f:
            return f.status, json.load(f)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round((len(v) - 1) * q)))] if v else None


class Poller(threading.Thread):
    """Collects window spans from GET /train and the receipt clock's offset to ours."""

    def __init__(self, base):
        super().__init__(daemon=True)
        self.base, self.spans, self.offsets, self.stop = base, {}, [], False

    def run(self):
        while not self.stop:
            t0 = time.monotonic()
            _, s = call(self.base, "GET", "/train")
            t1 = time.monotonic()
            if "clock_s" in s:
                self.offsets.append((t0 + t1) / 2 - s["clock_s"])
                for a, b in s.get("recent_windows", []):
                    self.spans[round(a, 6)] = (a, b)
            time.sleep(0.5)

    def offset(self):
        return pct(self.offsets, 0.5)


def serving_run(base, text, seconds, window_batches, seed):
    rng = random.Random(seed)
    words = text.split()
    name = f"bench-w{window_batches}-{int(time.time())}"
    code, st = call(base, "POST", "/train", {"adapter": name, "text": text, "seq_len": 64, "batch_size": 1, "epochs": 1000,
                                              "window_batches": window_batches, "max_slowdown_ppm": 100000, "learning_rate": 1e-4})
    assert code == 201, st
    poller = Poller(base)
    poller.start()
    turns = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(rng.uniform(0.3, 3.0))
        at = rng.randrange(0, len(words) - 40)
        prompt = " ".join(words[at:at + 24])
        t0 = time.monotonic()
        code, r = call(base, "POST", "/v1/completions", {"model": "gemma-3-270m", "prompt": prompt, "max_tokens": 64, "temperature": 0})
        t1 = time.monotonic()
        assert code == 200, r
        turns.append((t0, t1, r["usage"]["completion_tokens"]))
    call(base, "POST", "/train/cancel")
    while True:
        _, st = call(base, "GET", "/train")
        if st["state"] not in ("running", "paused", "starting"):
            break
        time.sleep(0.2)
    poller.stop = True
    poller.join()
    # The client's own receipt: its clock, its token counts; the windows' spans from the server.
    off = poller.offset()
    spans = sorted(poller.spans.values())
    clean, slowed, unmeasured, rates = None, [], 0, []
    for t0, t1, n in turns:
        if n < 16:
            continue
        a, b = t0 - off, t1 - off
        overlap = sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans)
        rate = n / (t1 - t0)
        rates.append((rate, overlap > LATENCY_S))
        if overlap <= LATENCY_S:
            clean = rate
        elif clean is None:
            unmeasured += 1
        else:
            slowed.append(min(1.0, max(0.0, 1 - rate / clean)))
    clean_rates = [r for r, o in rates if not o]
    mean_clean = sum(clean_rates) / len(clean_rates) if clean_rates else None
    avg_slowdown = (sum(max(0.0, 1 - r / mean_clean) for r, _ in rates) / len(rates)) if mean_clean and rates else None
    ppm = lambda x: None if x is None else int(round(x * 1e6))
    return {
        "window_batches": window_batches,
        "seconds": seconds,
        "turns": len(turns),
        "server": {k: st.get(k) for k in ["windows", "window_s_p50", "window_s_p95", "window_s_max", "yielded_s", "window_share_ppm",
                                           "realised_slowdown_ppm", "decode_tps_clean", "decode_tps_in_window", "forced_pauses",
                                           "turns_clean", "turns_overlapped", "turns_unmeasured", "turn_tps_clean",
                                           "turn_slowdown_ppm_p50", "turn_slowdown_ppm_p95", "turn_slowdown_ppm_max", "steps", "tokens_trained"]},
        "client": {"turns_clean": len(clean_rates), "turns_overlapped": len(slowed) + unmeasured, "turns_unmeasured": unmeasured,
                   "turn_tps_clean_mean": mean_clean, "turn_slowdown_ppm_p50": ppm(pct(slowed, 0.5)),
                   "turn_slowdown_ppm_p95": ppm(pct(slowed, 0.95)), "turn_slowdown_ppm_max": ppm(max(slowed) if slowed else None),
                   "average_slowdown_ppm_all_turns": ppm(avg_slowdown), "spans_seen": len(spans)},
    }


def fit_run(base, text, epochs):
    code, st = call(base, "POST", "/train", {"adapter": f"bench-fit-{int(time.time())}", "text": text, "seq_len": 128, "batch_size": 2,
                                              "epochs": epochs, "window_batches": 2, "share_ppm": 1000000, "learning_rate": 2e-4})
    assert code == 201, st
    while True:
        time.sleep(2)
        _, st = call(base, "GET", "/train")
        if st["state"] not in ("running", "paused", "starting"):
            break
    return {k: st.get(k) for k in ["state", "samples_train", "samples_eval", "steps", "tokens_trained", "train_tokens_per_s", "epochs", "loss_curve", "elapsed_s"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--windows", default="1,4", help="window sizes in batches")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of the full-share fit")
    ap.add_argument("--skip-fit", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    text = open(TEXT_FILE).read()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([os.path.join(ROOT, "target/release/perch"), "serve", "--port", str(port), "--ladder", "off", "--log-dir", "none", "--draft", "none"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if call(base, "GET", "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        report = {"model": "gemma-3-270m", "text": TEXT_FILE, "max_slowdown_ppm": 100000, "runs": []}
        for w in [int(x) for x in args.windows.split(",")]:
            print(f"[bench-train] serving while training, window = {w} batch(es), {args.seconds} s", file=sys.stderr)
            report["runs"].append(serving_run(base, text, args.seconds, w, args.seed + w))
        if not args.skip_fit:
            print(f"[bench-train] training at full share, {args.epochs} epoch(s)", file=sys.stderr)
            report["fit"] = fit_run(base, text, args.epochs)
    finally:
        server.terminate()
        server.wait()
    out = os.path.join(ROOT, "target/bench/train.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    json.dump(report, open(out, "w"), indent=1)
    for r in report["runs"]:
        s, c = r["server"], r["client"]
        print(f"window {r['window_batches']} batch(es): windows {s['windows']} (p50 {s['window_s_p50']:.2f} s, p95 {s['window_s_p95']:.2f} s, max {s['window_s_max']:.2f} s), "
              f"realised slowdown {s['realised_slowdown_ppm'] / 1e4:.1f} % (share {s['window_share_ppm'] / 1e4:.1f} %), client average over all turns {(c['average_slowdown_ppm_all_turns'] or 0) / 1e4:.1f} %")
        pp = lambda v: "-" if v is None else f"{v / 1e4:.1f} %"
        print(f"  turns: server clean {s['turns_clean']} overlapped {s['turns_overlapped']} (unmeasured {s['turns_unmeasured']}); client clean {c['turns_clean']} overlapped {c['turns_overlapped']}")
        print(f"  per-turn slowdown  receipt p50 {pp(s['turn_slowdown_ppm_p50'])} p95 {pp(s['turn_slowdown_ppm_p95'])} max {pp(s['turn_slowdown_ppm_max'])}"
              f" | client p50 {pp(c['turn_slowdown_ppm_p50'])} p95 {pp(c['turn_slowdown_ppm_p95'])} max {pp(c['turn_slowdown_ppm_max'])}")
    if "fit" in report:
        f = report["fit"]
        print(f"fit: {f['steps']} steps, {f['train_tokens_per_s']:.1f} tokens/s; eval loss by epoch {[round(e['eval_loss'], 4) for e in f['epochs'] if e.get('eval_loss') is not None]}")
    print(f"full report: {out}")


if __name__ == "__main__":
    main()
