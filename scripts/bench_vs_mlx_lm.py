"""Driver for scripts/bench-vs-mlx-lm (run it through that wrapper, which builds Perch and
installs the peer). Each measurement runs in its own process, Perch and mlx-lm alternating,
so neither inherits the other's warm caches or memory peak."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSAGE = (ROOT / "engine/src/bench_passage.txt").read_text()

# One mlx-lm measurement, mirroring `perch bench`: one untimed warm-up generation, then
# TTFT/prefill at 128 and 1024 prompt tokens and decode speed over N tokens, EOS ignored.
MLX_LM_BENCH = r"""
import json, resource, sys, time, platform
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
path, decode_tokens, passage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, tok = load(path)
if platform.system() == "Linux":
    model.set_dtype(mx.float32)  # Perch's compute dtype on the CPU backend
unit = tok._tokenizer(passage, add_special_tokens=False)["input_ids"]
def prompt(n):
    return [unit[i % len(unit)] for i in range(n)]
greedy = lambda x: mx.argmax(x, axis=-1)
def peak_rss():
    # VmHWM starts afresh at exec (ru_maxrss would carry the parent's peak); as `perch bench`.
    if platform.system() == "Linux":
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
def run(ids, n):
    t0 = time.perf_counter(); first = None; count = 0
    for _ in generate_step(mx.array(ids), model, max_tokens=n, sampler=greedy):
        count += 1
        if first is None: first = time.perf_counter()
    end = time.perf_counter()
    return first - t0, (count - 1) / max(end - first, 1e-9)
mx.reset_peak_memory()
run(prompt(16), 8)
ttft128, _ = run(prompt(128), 1)
ttft1024, _ = run(prompt(1024), 1)
_, decode = run(prompt(128), decode_tokens)
print(json.dumps({
    "prefill_128_tok_s": 128 / ttft128, "prefill_1024_tok_s": 1024 / ttft1024,
    "decode_tok_s": decode, "ttft_128_s": ttft128,
    "peak_mlx_memory_bytes": mx.get_peak_memory(),
    "peak_rss_bytes": peak_rss(),
}))
"""

FIGURES = [
    ("prefill_128_tok_s", "prefill @128 tok/s", "higher"),
    ("prefill_1024_tok_s", "prefill @1024 tok/s", "higher"),
    ("decode_tok_s", "decode tok/s", "higher"),
    ("ttft_128_s", "TTFT @128 s", "lower"),
    ("peak_rss_bytes", "peak RSS MB", "lower"),
]


def synthetic_model(out: Path) -> Path:
    import mlx.core as mx
    import numpy as np

    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    fixture = ROOT / "tests/fixtures/llama"
    cfg = json.loads((fixture / "config.json").read_text())
    cfg.update(hidden_size=1024, num_hidden_layers=8, intermediate_size=2816, num_attention_heads=16,
               num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, rope_scaling=None)
    rng = np.random.default_rng(0)
    h, i, v, hd = 1024, 2816, cfg["vocab_size"], 64
    lin = lambda o, n: (rng.standard_normal((o, n), dtype=np.float32) / np.sqrt(n))
    w = {"model.embed_tokens.weight": rng.standard_normal((v, h), dtype=np.float32),
         "model.norm.weight": np.ones(h, np.float32), "lm_head.weight": lin(v, h)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        w.update({f"{p}.input_layernorm.weight": np.ones(h, np.float32),
                  f"{p}.post_attention_layernorm.weight": np.ones(h, np.float32),
                  f"{p}.self_attn.q_proj.weight": lin(16 * hd, h), f"{p}.self_attn.k_proj.weight": lin(4 * hd, h),
                  f"{p}.self_attn.v_proj.weight": lin(4 * hd, h), f"{p}.self_attn.o_proj.weight": lin(h, 16 * hd),
                  f"{p}.mlp.gate_proj.weight": lin(i, h), f"{p}.mlp.up_proj.weight": lin(i, h),
                  f"{p}.mlp.down_proj.weight": lin(h, i)})
    mx.save_safetensors(str(out / "model.safetensors"), {k: mx.array(a) for k, a in w.items()}, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_text((fixture / f).read_text())
    return out


def perch(model: Path, decode: int) -> dict:
    out = subprocess.run([str(ROOT / "target/release/perch"), "bench", "--json", "--decode-tokens", str(decode),
                          "--model", str(model)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mlx_lm(model: Path, decode: int) -> dict:
    out = subprocess.run([sys.executable, "-c", MLX_LM_BENCH, str(model), str(decode), PASSAGE],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    args = ap.parse_args()
    model = args.model or synthetic_model(ROOT / ".deps/bench-models/llama-100m-f32")
    runs = {"perch": [], "mlx-lm": []}
    for r in range(args.rounds):
        # Alternate who goes first so drift on a noisy machine hits both alike.
        order = [("perch", perch), ("mlx-lm", mlx_lm)] if r % 2 == 0 else [("mlx-lm", mlx_lm), ("perch", perch)]
        for name, fn in order:
            runs[name].append(fn(model, args.decode_tokens))
            print(f"round {r + 1} {name}: {json.dumps(runs[name][-1])}", file=sys.stderr)
    result = {"model": str(model), "rounds": args.rounds, "figures": {}}
    print(f"\nmodel: {model}  (medians of {args.rounds} alternating rounds)")
    print(f"{'figure':<22}{'perch':>12}{'mlx-lm':>12}{'perch/mlx-lm':>14}  better")
    for key, label, better in FIGURES:
        p = median([x[key] for x in runs["perch"]])
        m = median([x[key] for x in runs["mlx-lm"]])
        scale = 1e-6 if key.endswith("bytes") else 1
        ratio = p / m if m else float("nan")
        result["figures"][key] = {"perch": p, "mlx_lm": m, "ratio": ratio}
        print(f"{label:<22}{p * scale:>12.3f}{m * scale:>12.3f}{ratio:>14.2f}  {better}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
