#!/usr/bin/env python3
"""Driver of scripts/bench-embeddings: the same sentences through Perch's /v1/embeddings and
sentence-transformers' encode, both engines at one batch size before the next size (the
median of several runs each). Prints one JSON line per (engine, batch) and the ratios."""
import argparse
import json
import random
import statistics
import time
import urllib.request

WORDS = ("the model server runs local language models on a laptop and answers editors agents "
         "and scripts with vectors for retrieval search notes code reviews caching tokens quickly "
         "while a person keeps typing in another window").split()


def sentences(n, seed=7):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) for _ in range(n)]


def perch(url, model):
    def embed(batch):
        body = json.dumps({"model": model, "input": batch}).encode()
        req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            out = json.load(r)
        assert len(out["data"]) == len(batch)
    return embed


def st(path):
    from sentence_transformers import SentenceTransformer
    m = SentenceTransformer(path, device="cpu")
    return lambda batch: m.encode(batch, batch_size=32)


def timed(f, batch, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(batch)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    engines = {"perch": perch(a.url, a.model), "sentence-transformers": st(a.dir)}
    data = sentences(256)
    for f in engines.values():  # warm both (first-call allocations, lazy loads)
        f(data[:32])
    rates = {}
    for b in [int(x) for x in a.batches.split(",")]:
        batch = data[:b]
        for name, f in engines.items():
            s = timed(f, batch, a.repeats if b > 1 else a.repeats * 4)
            rates[(name, b)] = b / s
            print(json.dumps({"engine": name, "batch": b, "seconds": round(s, 5),
                              "sentences_per_s": round(b / s, 1)}), flush=True)
    short = ["hello world"]
    for name, f in engines.items():
        print(json.dumps({"engine": name, "short_input_latency_ms": round(timed(f, short, 50) * 1e3, 2)}), flush=True)
    for b in [int(x) for x in a.batches.split(",")]:
        print(json.dumps({"batch": b, "perch_over_sentence_transformers":
                          round(rates[("perch", b)] / rates[("sentence-transformers", b)], 3)}))


if __name__ == "__main__":
    main()
