#!/usr/bin/env python3
"""Driver for scripts/bench-prefill-memory: for each prompt length, a fresh `perch serve` on
gemma-3-270m with a prefix cache of its own answers one /v1/completions request (max_tokens 1);
then its peak RSS (VmHWM), its RSS, and the bytes its prefix cache wrote to disk. One JSON
line per length, then the growth against the first length. Usage:
  prefill_memory.py PERCH_BINARY "1024 2048 4096 8192"
"""
import http.client, json, os, sys, tempfile, time
from pathlib import Path

import perch_serve

perch, lengths = sys.argv[1], [int(n) for n in " ".join(sys.argv[2:]).split()]
passage = (Path(__file__).resolve().parents[2] / "engine/src/runtime/passage.txt").read_text().split()

status = perch_serve.status_mb

rows = []
for n in lengths:
    with tempfile.TemporaryDirectory() as cache:
        # A prefix cache of its own for each length, the user's host copies shared (a first
        # load that makes them peaks higher than any prefill).
        copies = Path(os.environ.get("PERCH_CACHE_DIR") or Path.home() / ".cache/perch") / "host-copies"
        if copies.is_dir():
            os.symlink(copies, Path(cache) / "host-copies")
        env = dict(os.environ, PERCH_CACHE_DIR=cache)
        proc, port = perch_serve.start(perch, "serve", "--model", "gemma-3-270m", "--log-dir", "none",
                                       "--ladder", "off", "--no-load-warmup", env=env)
        # Gemma's tokenizer makes about 1.3 tokens of this passage's words.
        words = " ".join(passage[i % len(passage)] for i in range(int(n / 1.3)))
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
        base = status(proc.pid, "VmHWM:")
        t0 = time.time()
        c.request("POST", "/v1/completions", json.dumps({"model": "gemma-3-270m", "prompt": words, "max_tokens": 1}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        time.sleep(3)  # the disk tier's writer
        disk = sum(f.stat().st_size for f in (Path(cache) / "prefix").rglob("*.kv"))
        row = {"prompt_tokens": body["usage"]["prompt_tokens"], "seconds": round(time.time() - t0, 1),
               "peak_rss_mb_before": round(base), "peak_rss_mb": round(status(proc.pid, "VmHWM:")),
               "rss_mb_after": round(status(proc.pid, "VmRSS:")), "disk_tier_mb": round(disk / 2**20, 1)}
        row["peak_growth_mb"] = row["peak_rss_mb"] - row["peak_rss_mb_before"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        proc.terminate()
        proc.wait(timeout=60)
first = rows[0]
for r in rows[1:]:
    k = r["prompt_tokens"] / first["prompt_tokens"]
    g = r["peak_growth_mb"] / max(first["peak_growth_mb"], 1)
    print(f"{r['prompt_tokens']} tokens: {k:.1f}x the prompt, {g:.1f}x the peak growth, "
          f"{r['disk_tier_mb'] / max(first['disk_tier_mb'], 0.1):.1f}x the disk tier")
