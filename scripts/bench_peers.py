"""Driver for scripts/bench-vs-mlx-lm and scripts/bench-vs-peers (run it through those
wrappers, which build Perch and install the peers). Each measurement runs in its own process,
the engines alternating round by round, so none inherits another's warm caches or memory
peak, and drift on a noisy machine hits all alike. Every engine runs under `taskset` on the same
cores with as many threads as cores; `--isa avx2` keeps every engine to AVX2 on a CPU that has
AVX-512: OpenBLAS (under Perch's and mlx-lm's MLX) as Haswell, llama.cpp from a
build without AVX-512 (scripts/lib/llama_cpp_build.sh). Perch's own host kernels have an
AVX2 path only, so they run the same either way."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSAGE = (ROOT / "engine/src/runtime/passage.txt").read_text()
# The llama.cpp prelude every peer script starts with (no AMX buffers; scripts/lib).
PLAIN = (ROOT / "scripts/lib/llama_cpp_plain.py").read_text()

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

# llama.cpp through llama-cpp-python on a GGUF, one thread per core given, measured like the others.
# With PERCH_BENCH_LLAMA_REPACK set, llama.cpp's extra buffer types are back on (its weights
# repacked for the CPU's kernels, as llama.cpp does by default); safe only on a build without
# AMX (scripts/lib/llama_cpp_build.sh), as the prelude says.
LLAMA_CPP_BENCH = PLAIN + r"""
import os
if os.environ.get("PERCH_BENCH_LLAMA_REPACK"):
    _C.llama_model_default_params = _defaults
import json, sys, time
import numpy as np
from llama_cpp import Llama
path, decode_tokens, passage, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=2048, n_batch=512, n_threads=threads, verbose=False)
unit = llm.tokenize(passage.encode(), add_bos=False, special=False)
def prompt(n):
    return [unit[i % len(unit)] for i in range(n)]
n_vocab = llm.n_vocab()
def last_logits():
    # Without logits_all, llama-cpp-python leaves `scores` empty; read the context's row.
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
def run(ids, n):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t = int(np.argmax(last_logits()))
    first = time.perf_counter()
    for _ in range(n - 1):
        llm.eval([t])
        t = int(np.argmax(last_logits()))
    end = time.perf_counter()
    return first - t0, (n - 1) / max(end - first, 1e-9)
run(prompt(16), 8)
ttft128, _ = run(prompt(128), 1)
ttft1024, _ = run(prompt(1024), 1)
_, decode = run(prompt(128), decode_tokens)
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"prefill_128_tok_s": 128 / ttft128, "prefill_1024_tok_s": 1024 / ttft1024,
                  "decode_tok_s": decode, "ttft_128_s": ttft128, "peak_rss_bytes": hwm}))
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


# Set by main(): the cores every engine is pinned to, and the environment that keeps an
# engine to the chosen instruction set.
CPUS: list = sorted(os.sched_getaffinity(0))
ISA_ENV: dict = {}
LLAMA_ENV: dict = {}


def pinned(cmd: list) -> list:
    return ["taskset", "-c", ",".join(map(str, CPUS))] + cmd


def run_json(cmd: list, env: dict) -> dict:
    out = subprocess.run(pinned(cmd), check=True, capture_output=True, text=True, env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_line() -> str:
    """The CPU's model and the vector instruction sets it lists, as the figures depend on them."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "unknown")
    flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
    vector = sorted(f for f in set(flags) if f.startswith(("avx", "amx", "fma")))
    return f"CPU: {model}; cores used {CPUS}; lists {' '.join(vector) or 'no AVX'}"


def perch(model: Path, decode: int, host: bool = True) -> dict:
    env = dict(ISA_ENV)
    if not host:
        env["PERCH_NO_HOST_HEAD"] = "1"  # MLX's f32 matmuls for every step
    return run_json([str(ROOT / "target/release/perch"), "bench", "--json", "--decode-tokens", str(decode),
                     "--model", str(model)], env)


def mlx_lm(model: Path, decode: int) -> dict:
    return run_json([sys.executable, "-c", MLX_LM_BENCH, str(model), str(decode), PASSAGE], ISA_ENV)


def llama_cpp(gguf: Path, decode: int) -> dict:
    return run_json([sys.executable, "-c", LLAMA_CPP_BENCH, str(gguf), str(decode), PASSAGE, str(len(CPUS))],
                    LLAMA_ENV)


def bandwidth_gb_s() -> float:
    """One-thread read bandwidth: sum over a 1 GiB array (best of 3)."""
    import numpy as np
    a = np.ones(1 << 27)  # 1 GiB of f64
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def weight_bytes_per_token(model: Path) -> float:
    """Bytes of weights one decode step reads, as Perch computes (f32 on Linux, scales widened)."""
    from safetensors import safe_open
    total = 0
    for f in model.glob("model*.safetensors"):
        with safe_open(str(f), "np") as st:
            for k in st.keys():
                shape = st.get_slice(k).get_shape()
                n = 1
                for d in shape:
                    n *= d
                total += n * 4  # uint32 packs stay 4 bytes per word; floats widen to f32
    return total


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def table(engines: dict, rounds: int, baseline: str) -> dict:
    names = list(engines)
    result = {}
    print(f"\n(medians of {rounds} alternating rounds, [min-max] over them; ratios are each engine / {baseline})")
    print(f"{'figure':<22}" + "".join(f"{n:>30}" for n in names))
    for key, label, better in FIGURES:
        row = f"{label:<22}"
        base = median([x[key] for x in engines[baseline]]) if engines[baseline] and key in engines[baseline][0] else None
        for n in names:
            if not engines[n] or key not in engines[n][0]:
                row += f"{'-':>30}"
                continue
            xs = [x[key] for x in engines[n]]
            v = median(xs)
            result.setdefault(key, {})[n] = v
            scale = 1e-6 if key.endswith("bytes") else 1
            ratio = f" ({v / base:.2f}x)" if base and n != baseline else ""
            spread = f" [{min(xs) * scale:.1f}-{max(xs) * scale:.1f}]" if len(xs) > 1 else ""
            row += f"{f'{v * scale:.2f}{ratio}{spread}':>30}"
        print(row + f"   {better} is better")
    return result


def run_rounds(engines: dict, rounds: int) -> dict:
    runs = {name: [] for name in engines}
    for r in range(rounds):
        order = list(engines.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            runs[name].append(fn())
            print(f"round {r + 1} {name}: {json.dumps(runs[name][-1])}", flush=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="perch vs mlx-lm on this MLX directory")
    ap.add_argument("--peers", action="store_true", help="Gemma 3 270M: perch bf16/4-bit, mlx-lm, llama.cpp")
    ap.add_argument("--defaults", action="store_true",
                    help="both installed default models (f32 imports): perch with and without the host path, mlx-lm, llama.cpp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: every engine without AVX-512 (OpenBLAS as Haswell, llama.cpp built for AVX2)")
    ap.add_argument("--llama-lib", type=Path, help="llama.cpp's libraries for --isa avx2 (bench-vs-peers builds them)")
    ap.add_argument("--llama-repack", action="store_true",
                    help="llama.cpp with its repacked weights (its default; needs --llama-lib)")
    ap.add_argument("--models", help="with --defaults: these model ids (qwen2.5-coder-1.5b-instruct needs "
                                     "scripts/setup-default-model --agent)")
    ap.add_argument("--engines", help="with --defaults: only these, e.g. perch,llama.cpp")
    ap.add_argument("--cpus", help="cores to pin every engine to, e.g. 0,1 (default: all this process may use)")
    args = ap.parse_args()
    d = args.decode_tokens
    global CPUS
    if args.cpus:
        CPUS = [int(c) for c in args.cpus.split(",")]
    if args.isa == "avx2":
        ISA_ENV["OPENBLAS_CORETYPE"] = "Haswell"
        if not args.llama_lib:
            sys.exit("--isa avx2 needs --llama-lib (scripts/bench-vs-peers --isa avx2 builds it)")
    if args.llama_lib:
        LLAMA_ENV["LLAMA_CPP_LIB_PATH"] = str(args.llama_lib)
    if args.llama_repack:
        if not args.llama_lib:
            sys.exit("--llama-repack needs --llama-lib: the pip build has AMX kernels, which crashed here")
        LLAMA_ENV["PERCH_BENCH_LLAMA_REPACK"] = "1"
    llama = f"llama.cpp {'from ' + str(args.llama_lib) if args.llama_lib else 'from pip (native build)'}, " \
            f"weights {'repacked' if args.llama_repack else 'not repacked (no extra buffer types)'}"
    print(cpu_line() + f"; engines run {'AVX2 only' if args.isa == 'avx2' else 'natively (no AMX)'}; {llama}")
    if args.defaults:
        installed = json.loads(subprocess.run([str(ROOT / "target/release/perch"), "models", "--json"],
                                              check=True, capture_output=True, text=True).stdout)
        paths = {m["id"]: Path(m["path"]) for m in installed}
        results = {}
        fetchers = {"gemma-3-270m": "fetch-gemma-gguf", "qwen2.5-coder-0.5b-instruct": "fetch-qwen-gguf",
                    "qwen2.5-coder-1.5b-instruct": "fetch-agent-gguf"}
        wanted = args.models.split(",") if args.models else ["gemma-3-270m", "qwen2.5-coder-0.5b-instruct"]
        for model_id in wanted:
            fetch = fetchers[model_id]
            gguf = Path(subprocess.run([str(ROOT / "scripts" / fetch)], check=True, capture_output=True, text=True).stdout.strip())
            path = paths[model_id]
            engines = {
                "perch": lambda path=path: perch(path, d),
                "perch MLX only": lambda path=path: perch(path, d, host=False),
                "mlx-lm": lambda path=path: mlx_lm(path, d),
                "llama.cpp": lambda gguf=gguf: llama_cpp(gguf, d),
            }
            if args.engines:
                engines = {k: v for k, v in engines.items() if k in args.engines.split(",")}
            runs = run_rounds(engines, args.rounds)
            print(f"\n{model_id} (f32 import of its Q4_K_M GGUF; llama.cpp on the GGUF, {len(CPUS)} threads)")
            results[model_id] = table(runs, args.rounds, "llama.cpp")
        print(json.dumps({"figures": results, "rounds": args.rounds, "isa": args.isa, "cpu": cpu_line(),
                          "llama": llama}))
        return
    if args.peers:
        gguf = Path(subprocess.run([str(ROOT / "scripts/fetch-gemma-gguf")], check=True, capture_output=True, text=True).stdout.strip())
        dirs = {}
        for q in ("none", "4"):
            out = ROOT / ".deps/bench-models" / f"gemma-3-270m-{'bf16' if q == 'none' else '4bit'}"
            if not (out / "model.safetensors").exists():
                subprocess.run([str(ROOT / "target/release/perch"), "--models-dir", str(out.parent), "import", str(gguf),
                                "--name", out.name, "--quantize", q, "--dtype", "bf16", "--overwrite"], check=True)
            dirs[q] = out
        engines = {
            "perch bf16": lambda: perch(dirs["none"], d),
            "mlx-lm bf16": lambda: mlx_lm(dirs["none"], d),
            "perch 4-bit": lambda: perch(dirs["4"], d),
            "mlx-lm 4-bit": lambda: mlx_lm(dirs["4"], d),
            "llama.cpp Q4_K_M": lambda: llama_cpp(gguf, d),
        }
        runs = run_rounds(engines, args.rounds)
        print(f"\nGemma 3 270M on this machine; Perch and mlx-lm compute in f32 over OpenBLAS on the CPU")
        result = table(runs, args.rounds, "perch bf16")
        bw = bandwidth_gb_s()
        print(f"\nphysical limit: one-thread read bandwidth {bw:.1f} GB/s")
        for q, path in dirs.items():
            b = weight_bytes_per_token(path)
            dec = result["decode_tok_s"][f"perch {'bf16' if q == 'none' else '4-bit'}"]
            print(f"  perch {'bf16' if q == 'none' else '4-bit'}: {b / 1e6:.0f} MB of weights per token -> "
                  f"{dec * b / 1e9:.1f} GB/s at {dec:.1f} tok/s ({dec * b / 1e9 / bw:.0%} of bandwidth; "
                  f"bound {bw * 1e9 / b:.1f} tok/s)")
        print(json.dumps({"figures": result, "bandwidth_gb_s": bw}))
        return
    model = args.model or synthetic_model(ROOT / ".deps/bench-models/llama-100m-f32")
    runs = run_rounds({"perch": lambda: perch(model, d), "mlx-lm": lambda: mlx_lm(model, d)}, args.rounds)
    print(f"\nmodel: {model}")
    result = table(runs, args.rounds, "mlx-lm")
    print(json.dumps({"model": str(model), "rounds": args.rounds, "figures": result}))


if __name__ == "__main__":
    main()
