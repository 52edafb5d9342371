"""Pipeline sharding on loopback (scripts/bench-shard): the default model served by 1, 2 and 3
`perch serve` processes in one run. For each: prefill and decode rates of the same request
(prefix cache off, so every run prefills cold), each process's resident memory (VmRSS, and
VmHWM for the peak), and from rank 0's /health the ring's traffic: passes, bytes, and the
time rank 0 waited beyond the other ranks' computing (the communication).
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERCH = os.environ.get("PERCH_BIN", os.path.join(ROOT, "target/release/perch"))
MODEL = "qwen2.5-coder-0.5b-instruct"
PASSAGE = open(os.path.join(ROOT, "engine/src/runtime/passage.txt")).read()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    return json.load(urllib.request.urlopen(url, timeout=600))


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=1800))


def memory(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def start(n, tmp):
    """Rank 0's URL and every process (workers first) of an n-rank group (n = 1: alone)."""
    procs, extra = [], []
    if n > 1:
        hosts = os.path.join(tmp, f"hosts-{n}.json")
        with open(hosts, "w") as f:
            json.dump([[f"127.0.0.1:{free_port()}"] for _ in range(n)], f)
        for rank in range(1, n):
            procs.append(subprocess.Popen(
                [PERCH, "serve", "--model", MODEL, "--hostfile", hosts, "--rank", str(rank)],
                stderr=subprocess.DEVNULL))
        extra = ["--hostfile", hosts, "--rank", "0"]
    port = free_port()
    rank0 = subprocess.Popen(
        [PERCH, "serve", "--model", MODEL, "--port", str(port), "--log-dir", "none",
         "--ladder", "off", "--conversations-dir", "none", "--mcp-file", "none",
         "--prefix-cache-mb", "0", "--prefix-cache-disk-mb", "0", *extra],
        stderr=subprocess.PIPE, text=True)
    procs.append(rank0)
    for line in rank0.stderr:
        if "serving" in line:
            break
    else:
        sys.exit(f"rank 0 of {n} did not serve")
    return f"http://127.0.0.1:{port}", procs


def stop(procs):
    # Rank 0 first, gracefully: it tells the others to leave.
    procs[-1].send_signal(signal.SIGINT)
    for p in reversed(procs):
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def traffic(url):
    shard = get(url + "/health").get("shard")
    return shard["traffic"] if shard else None


def measure(n, args, tmp):
    url, procs = start(n, tmp)
    words = PASSAGE.split()
    prompt = " ".join((words * (1 + 4 * args.prompt_tokens // len(words)))[: int(args.prompt_tokens * 0.72)])
    prompt += "\n\nNow count from 1 to 1000, separated by commas: 1, 2, 3,"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": args.decode_tokens, "temperature": 0}
    post(url + "/v1/completions", {**body, "max_tokens": 4})  # first use: lazy loads
    rows = []
    for _ in range(args.runs):
        before = traffic(url)
        answer = post(url + "/v1/completions", body)
        last = get(url + "/health")["last_request"]
        after = traffic(url)
        usage = answer["usage"]
        row = {
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "prefill_tok_s": usage["prompt_tokens"] / last["ttft_s"],
            "decode_tok_s": last["decode_tok_s"],
            "text": answer["choices"][0]["text"],
        }
        if before is not None:
            passes = after["passes"] - before["passes"]
            wait = after["wait_s"] - before["wait_s"]
            remote = after["remote_compute_s"] - before["remote_compute_s"]
            row["passes"] = passes
            row["comm_ms_per_pass"] = 1e3 * (wait - remote) / passes
            row["wait_ms_per_pass"] = 1e3 * wait / passes
            row["hidden_bytes_per_token"] = (after["hidden_bytes"] - before["hidden_bytes"]) / max(
                1, after["tokens"] - before["tokens"])
        rows.append(row)
    mem = [memory(p.pid) for p in procs]  # workers first, rank 0 last
    health = get(url + "/health")
    stop(procs)
    med = lambda k: statistics.median(r[k] for r in rows) if k in rows[0] else None
    return {
        "ranks": n,
        "prompt_tokens": rows[0]["prompt_tokens"],
        "completion_tokens": rows[0]["completion_tokens"],
        "prefill_tok_s": med("prefill_tok_s"),
        "decode_tok_s": med("decode_tok_s"),
        "decode_ms_per_token": 1e3 / med("decode_tok_s"),
        "comm_ms_per_pass": med("comm_ms_per_pass"),
        "wait_ms_per_pass": med("wait_ms_per_pass"),
        "hidden_bytes_per_token": med("hidden_bytes_per_token"),
        "rss_bytes_by_rank": [m["VmRSS"] for m in mem[-1:] + mem[:-1]],
        "peak_rss_bytes_by_rank": [m["VmHWM"] for m in mem[-1:] + mem[:-1]],
        "layer_starts": (health.get("shard") or {}).get("layer_starts"),
        "weight_bytes_by_rank": (health.get("shard") or {}).get("weight_bytes"),
        "text": rows[0]["text"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with open("/proc/cpuinfo") as f:
        info = f.read()
    cpu = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    isa = "avx512f" if " avx512f" in info else "avx2" if " avx2" in info else "?"
    print(f"# {cpu} ({isa}), {os.cpu_count()} CPUs; model {MODEL}; {args.runs} runs, medians", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.ranks.split(",")]:
            r = measure(n, args, tmp)
            results.append(r)
            rss = " ".join(f"{b / 2**20:.0f}" for b in r["rss_bytes_by_rank"])
            comm = "" if r["comm_ms_per_pass"] is None else f" comm/pass {r['comm_ms_per_pass']:.3f} ms (wait {r['wait_ms_per_pass']:.2f} ms)"
            print(f"ranks {n}: prefill {r['prefill_tok_s']:.1f} tok/s ({r['prompt_tokens']} tokens), decode "
                  f"{r['decode_tok_s']:.2f} tok/s = {r['decode_ms_per_token']:.1f} ms/token "
                  f"({r['completion_tokens']} tokens); RSS MiB by rank {rss};{comm}; layers {r['layer_starts']}",
                  flush=True)
    base = results[0]
    if base["ranks"] == 1:
        for r in results[1:]:
            rss = [b / base["rss_bytes_by_rank"][0] for b in r["rss_bytes_by_rank"]]
            same = "same text" if r["text"] == base["text"] else "TEXT DIFFERS"
            print(f"ranks {r['ranks']} vs 1: decode time per token x{base['decode_tok_s'] / r['decode_tok_s']:.2f}, "
                  f"prefill x{base['prefill_tok_s'] / r['prefill_tok_s']:.2f} slower; RSS per rank "
                  + " ".join(f"{x:.2f}" for x in rss) + f" of one process's; {same}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
