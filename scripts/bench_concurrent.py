"""Driver for scripts/bench-concurrent (run it through that wrapper, which builds Perch, starts
the servers and tears them down). N streaming clients at once against one OpenAI-compatible
server, the same client code for every engine: each stream's time to first token and its
gaps between tokens, the aggregate decode rate, and the longest gap a running stream sees
while a long prompt joins. Prints one JSON object per run."""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
PASSAGE = (ROOT / "engine/src/runtime/passage.txt").read_text()


def prompt_of(words, tag):
    """About `words` words of the passage, opened by a tag of its own so that no two
    clients share a prefix (each engine's prefix cache would otherwise favour it)."""
    unit = PASSAGE.split()
    body = " ".join(unit[i % len(unit)] for i in range(words))
    return f"[{tag}] {body}"


def stream(url, model, prompt, max_tokens, out, started):
    """One streaming /v1/completions request: when it was sent, each token's arrival."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    times = []
    # Visible while it streams: the joining scenario waits for every stream's first token.
    out.update(times=times)
    started.wait()
    t0 = time.perf_counter()
    out.update(sent=t0)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        out.update(error=f"HTTP {r.status}: {r.read()[:300]!r}")
        return
    usage = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if choices and choices[0].get("text"):
            times.append(time.perf_counter())
    out.update(usage=usage, done=True)


def run(url, model, clients, words, max_tokens, joiner_words=0):
    """`clients` streams at once; with `joiner_words`, one more request of that many words
    joins once every stream has its first token."""
    started = threading.Event()
    outs = [dict() for _ in range(clients)]
    threads = [
        threading.Thread(target=stream, args=(url, model, prompt_of(words, f"c{i}-{time.time_ns()}"), max_tokens, outs[i], started))
        for i in range(clients)
    ]
    for t in threads:
        t.start()
    started.set()
    joined = None
    if joiner_words:
        while not all(o.get("times") or o.get("error") for o in outs):
            if not any(t.is_alive() for t in threads):
                break
            time.sleep(0.005)
        jout, go = {}, threading.Event()
        jt = threading.Thread(target=stream, args=(url, model, prompt_of(joiner_words, f"j-{time.time_ns()}"), 1, jout, go))
        jt.start()
        go.set()
        joined = (jout, jt)
    for t in threads:
        t.join()
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        return {"error": errors[0]}
    ttfts = [o["times"][0] - o["sent"] for o in outs if o["times"]]
    tokens = [max(len(o["times"]), (o.get("usage") or {}).get("completion_tokens", 0)) for o in outs]
    first = min(o["times"][0] for o in outs if o["times"])
    last = max(o["times"][-1] for o in outs if o["times"])
    gaps = [b - a for o in outs for a, b in zip(o["times"], o["times"][1:])]
    result = {
        "clients": clients,
        "prompt_words": words,
        "completion_tokens": sum(tokens),
        "aggregate_decode_tok_s": sum(max(n - 1, 0) for n in tokens) / max(last - first, 1e-9),
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p95_s": sorted(ttfts)[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
        "median_gap_s": statistics.median(gaps) if gaps else None,
    }
    if joined:
        jout, jt = joined
        jt.join()
        if jout.get("times"):
            t_in, t_done = jout["sent"], jout["times"][-1]
            # The longest gap of any running stream that overlaps the joiner's prefill.
            during = [b - a for o in outs for a, b in zip(o["times"], o["times"][1:]) if b > t_in and a < t_done]
            result["joiner_words"] = joiner_words
            result["joiner_ttft_s"] = t_done - t_in
            result["longest_gap_while_joining_s"] = max(during) if during else None
        else:
            result["joiner_error"] = jout.get("error", "no token")
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--long-clients", default=None, help="for the long prompts (default: --clients)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--short-words", type=int, default=24)
    ap.add_argument("--long-words", type=int, default=1500, help="about 2k tokens")
    ap.add_argument("--joiner-words", type=int, default=3000, help="about 4k tokens")
    a = ap.parse_args()
    # Warm the engine (first-use costs are not what this measures).
    run(a.url, a.model, 1, a.short_words, 8)
    for words, clients in ((a.short_words, a.clients), (a.long_words, a.long_clients or a.clients)):
        for n in map(int, clients.split(",")):
            r = run(a.url, a.model, n, words, a.max_tokens)
            print(json.dumps({"engine": a.engine, **r}), flush=True)
    # A long prompt joining four running streams.
    r = run(a.url, a.model, 4, a.short_words, a.max_tokens * 2, a.joiner_words)
    print(json.dumps({"engine": a.engine, "scenario": "join", **r}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
