"""Driver for scripts/bench-agent: a 12-turn agent-like transcript (a system prompt and tool
definitions, then per turn a user request, a tool call and its result) on the default chat
model, measuring each turn's time to first token with Perch's prefix cache off and on, the
first turn after a restart (disk tier), a second conversation that shares the system prompt,
and the same transcript on llama.cpp (llama-cpp-python reuses the common prefix of
consecutive calls) and mlx-lm (its prompt cache, trimmed to the common prefix).

Every engine sees the same prompt: Perch renders it from the chat request; the peers get the
text jinja2 renders from the model's own template (scripts/render_templates.py), tokenized
by each; the token counts are printed side by side. Each turn asks for one token, so a
turn's time is its prefill (plus one decode step)."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from render_templates import environment  # noqa: E402

PASSAGE = (ROOT / "engine/src/runtime/passage.txt").read_text().split()
# The llama.cpp prelude every peer script starts with (no AMX buffers; scripts/lib).
PLAIN = (ROOT / "scripts/lib/llama_cpp_plain.py").read_text()
MODEL_ID = "qwen2.5-coder-0.5b-instruct"
TURNS = 12


def words(start: int, n: int) -> str:
    return " ".join(PASSAGE[(start + i) % len(PASSAGE)] for i in range(n))


def transcript(scale: float):
    """System prompt + tools of about 3k tokens at scale 1, each turn adding about 400."""
    system = "You are a coding agent working in a repository. Follow these notes.\n" + words(0, int(1100 * scale))
    tools = []
    for i in range(int(12 * scale) or 1):
        tools.append({"type": "function", "function": {
            "name": f"tool_{i}",
            "description": f"Tool {i}: " + words(100 * i, int(70 * scale) or 1),
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "A file path in the repository."},
                "query": {"type": "string", "description": words(7 * i, 12)},
            }, "required": ["path"]},
        }})
    turns = []
    for t in range(TURNS):
        user = {"role": "user", "content": f"Step {t + 1}: " + words(300 + 50 * t, int(60 * scale) or 1)}
        args = json.dumps({"path": f"src/file_{t}.rs", "query": words(t, 4)})
        call = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{t}", "type": "function", "function": {"name": "tool_0", "arguments": args}}]}
        result = {"role": "tool", "tool_call_id": f"call_{t}", "content": words(900 + 200 * t, int(230 * scale) or 1)}
        turns.append((user, call, result))
    return system, tools, turns


def messages_for(system, turns, n):
    """Turn n (1-based): the history of turns before it, then its user message."""
    msgs = [{"role": "system", "content": system}]
    for user, call, result in turns[: n - 1]:
        msgs += [user, call, result]
    msgs.append(turns[n - 1][0])
    return msgs


def render(model_dir: Path, msgs, tools) -> str:
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    template = environment().from_string(cfg["chat_template"])
    as_objects = []
    for m in msgs:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in m["tool_calls"]]
        as_objects.append(m)
    return template.render(messages=as_objects, tools=tools, add_generation_prompt=True,
                           bos_token=cfg.get("bos_token") or "", eos_token=cfg.get("eos_token") or "")


# ---------------------------------------------------------------- Perch over HTTP

class Perch:
    def __init__(self, port: int, cache_dir: Path, cache_on: bool):
        args = [str(ROOT / "target/release/perch"), "serve", "--model", MODEL_ID, "--port", str(port),
                "--ladder", "off", "--no-load-warmup", "--log-dir", "none",
                "--prefix-cache-dir", str(cache_dir)]
        if not cache_on:
            args += ["--prefix-cache-mb", "0", "--prefix-cache-disk-mb", "0"]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                self.get("/health")
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise SystemExit("perch serve did not start")
        # One untimed request, unrelated to the transcript: process warm-up, not the cache.
        self.chat([{"role": "user", "content": "hi"}], [])

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read())

    def chat(self, msgs, tools):
        body = {"model": MODEL_ID, "messages": msgs, "max_tokens": 1, "temperature": 0}
        if tools:
            body["tools"] = tools
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=3600) as r:
            out = json.loads(r.read())
        dt = time.perf_counter() - t0
        u = out["usage"]
        return dt, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]

    def wait_disk_entries(self, n):
        for _ in range(600):
            if self.get("/health")["prefix_cache"]["disk_entries"] >= n:
                return
            time.sleep(0.1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def perch_runs(system, tools, turns, port):
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        off = Perch(port, tmp / "off", cache_on=False)
        res["cold"] = [off.chat(messages_for(system, turns, n), tools) for n in range(1, TURNS + 1)]
        off.stop()
        on = Perch(port, tmp / "on", cache_on=True)
        warm = []
        for n in range(1, TURNS + 1):
            warm.append(on.chat(messages_for(system, turns, n), tools))
            if n == TURNS - 1:
                # What a restart before the last turn would find on disk.
                on.wait_disk_entries(1)
                time.sleep(1.0)
                shutil.copytree(tmp / "on", tmp / "snapshot")
        res["warm"] = warm
        other = [{"role": "system", "content": system}, {"role": "user", "content": "A different task: " + words(5000, 40)}]
        res["second_conversation"] = on.chat(other, tools)
        on.stop()
        again = Perch(port, tmp / "snapshot", cache_on=True)
        res["after_restart"] = again.chat(messages_for(system, turns, TURNS), tools)
        res["after_restart_disk_loads"] = again.get("/health")["prefix_cache"]["disk_loads"]
        again.stop()
    return res


# ---------------------------------------------------------------- peers, in their own processes

LLAMA_CPP = PLAIN + r"""
import json, sys, time
from llama_cpp import Llama
gguf, prompts = sys.argv[1], json.loads(sys.stdin.read())
llm = Llama(model_path=gguf, n_ctx=16384, n_batch=512, n_threads=2, verbose=False)
ids = [llm.tokenize(p.encode(), add_bos=False, special=True) for p in prompts]
llm.create_completion(prompt=llm.tokenize(b"hi", add_bos=False), max_tokens=1, temperature=0)
def run(x):
    t0 = time.perf_counter(); llm.create_completion(prompt=x, max_tokens=1, temperature=0); return time.perf_counter() - t0
cold = []
for x in ids:
    llm.reset(); cold.append(run(x))
llm.reset()
warm = [run(x) for x in ids]
print(json.dumps({"tokens": [len(x) for x in ids], "cold": cold, "warm": warm}))
"""

MLX_LM = r"""
import json, sys, time, platform
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
path, prompts = sys.argv[1], json.loads(sys.stdin.read())
model, tok = load(path)
if platform.system() == "Linux":
    model.set_dtype(mx.float32)
ids = [tok._tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
greedy = lambda x: mx.argmax(x, axis=-1)
def run(x, cache):
    t0 = time.perf_counter()
    for _ in generate_step(mx.array(x), model, max_tokens=1, sampler=greedy, prompt_cache=cache):
        break
    return time.perf_counter() - t0
run(ids[0][:16], make_prompt_cache(model))
cold = [run(x, make_prompt_cache(model)) for x in ids]
cache, held, warm = make_prompt_cache(model), [], []
for x in ids:
    common = 0
    while common < min(len(held), len(x) - 1) and held[common] == x[common]:
        common += 1
    trim_prompt_cache(cache, cache[0].offset - common)
    warm.append(run(x[common:], cache))
    held = list(x)
    trim_prompt_cache(cache, cache[0].offset - len(x))
print(json.dumps({"tokens": [len(x) for x in ids], "cold": cold, "warm": warm}))
"""


def peer(code, target, prompts):
    out = subprocess.run([sys.executable, "-c", code, str(target)], input=json.dumps(prompts),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="text lengths (1: about 3k growing to 8k tokens)")
    ap.add_argument("--models-dir", type=Path, default=Path(os.environ.get("PERCH_MODELS_DIR", Path.home() / ".local/share/perch/models")))
    ap.add_argument("--gguf", type=Path, default=ROOT / ".deps/qwen/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--port", type=int, default=17342)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--peer", action="append", choices=["llama.cpp", "mlx-lm"],
                    help="run only these peers (repeatable; default: both)")
    a = ap.parse_args()
    model_dir = a.models_dir / MODEL_ID
    system, tools, turns = transcript(a.scale)
    prompts = [render(model_dir, messages_for(system, turns, n), tools) for n in range(1, TURNS + 1)]
    started = time.time()
    p = perch_runs(system, tools, turns, a.port)
    peers = {}
    wanted = [] if a.no_peers else (a.peer or ["llama.cpp", "mlx-lm"])
    if "llama.cpp" in wanted:
        peers["llama.cpp"] = peer(LLAMA_CPP, a.gguf, prompts)
    if "mlx-lm" in wanted:
        peers["mlx-lm"] = peer(MLX_LM, model_dir, prompts)
    print(f"agent transcript, scale {a.scale}, {TURNS} turns, one token per turn; seconds to first token\n")
    head = "turn  tokens  cached | perch cold  warm  ratio"
    for name in peers:
        head += f" | {name} tokens cold  warm  ratio"
    print(head)
    for i in range(TURNS):
        (c, n, _), (w, _, k) = p["cold"][i], p["warm"][i]
        line = f"{i + 1:>4}  {n:>6}  {k:>6} | {c:>9.2f} {w:>5.2f} {w / c:>6.3f}"
        for name, r in peers.items():
            line += f" | {r['tokens'][i]:>{len(name) + 7}} {r['cold'][i]:>5.2f} {r['warm'][i]:>5.2f} {r['warm'][i] / r['cold'][i]:>6.3f}"
        print(line)
    last_cold = p["cold"][-1][0]
    restart, _, restart_cached = p["after_restart"]
    second, second_n, second_cached = p["second_conversation"]
    print(f"\nperch turn {TURNS}: warm/cold {p['warm'][-1][0] / last_cold:.3f} (goal <= 0.1)")
    for name, r in peers.items():
        print(f"{name} turn {TURNS}: warm/cold {r['warm'][-1] / r['cold'][-1]:.3f}")
    print(f"first turn after a restart (turn {TURNS}, disk tier, {restart_cached} tokens reused, "
          f"{p['after_restart_disk_loads']} disk load): {restart:.2f} s vs cold {last_cold:.2f} s = {last_cold / restart:.1f}x faster (goal >= 5x)")
    print(f"second conversation sharing the system prompt: {second_cached} of {second_n} tokens reused, "
          f"{second:.2f} s (turn 1 cold: {p['cold'][0][0]:.2f} s)")
    print(f"\nwall time {time.time() - started:.0f} s")
    print(json.dumps({"perch": p, "peers": peers, "scale": a.scale}), file=sys.stderr)


if __name__ == "__main__":
    main()
