"""Groups perf samples of a decode run into parts (scripts/profile-decode): Perch's host
products, its attention, its step (norms, residuals, activation), MLX, OpenBLAS, thread
hand-offs (rayon, OpenMP, locks; the kernel's scheduling and wake-ups where perf may sample
the kernel) and the rest; and the cores' idle share, from the samples' span against the
cores' wall time. Only samples from the first decode-step
symbol on count, so loading and prefill stay out. Symbols inlined into others count where
they were inlined (the attention's loops show as iterator adapters: "other")."""

import argparse
import json
import re
from collections import Counter

# Order matters: the first pattern that matches a sample's "dso symbol" names its part.
PARTS = [
    ("attention (host)", r"host_decode_attention|host_attention|Rope.*host|attend"),
    ("products (host copies)", r"host_matrix|HostMatrix"),
    ("step: norms, residuals, activation", r"host_step|rms_norm|gated|gelu|silu|Mlp::host|expf"),
    ("kernel: scheduling, yields, wake-ups", r"kernel.*(schedul|yield|futex|switch|spin_unlock|wake|syscall)|(schedul|yield|futex|switch|spin_unlock|wake|syscall).*kernel"),
    ("kernel: page faults", r"kernel.*(clear_page|fault|unmap|page)|(clear_page|fault|unmap|page).*kernel"),
    ("kernel: other", r"\[kernel"),
    ("thread hand-offs (user space)", r"rayon|crossbeam|libgomp|omp_|futex|sched_yield|pthread|parking|Condvar|Mutex|std::sync|std::thread"),
    ("OpenBLAS", r"libopenblas|openblas|blas"),
    ("MLX", r"libmlx|mlx::|mlx_"),
    ("memory copies", r"memcpy|memmove|memset"),
]
# A one-vector product from the host copies: decode's (loading hashes, prefill widens and
# calls sgemm).
DECODE_START = re.compile(r"rows_into")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("bench")
    ap.add_argument("--cores", type=int, required=True)
    ap.add_argument("--hz", type=int, required=True)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    rows = []
    for line in open(a.samples, errors="replace"):
        m = re.match(r"\s*(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*)$", line)
        if m:
            rows.append((int(m.group(1)), float(m.group(2)), m.group(3)))
    first = next((i for i, r in enumerate(rows) if DECODE_START.search(r[2])), None)
    if first is None:
        raise SystemExit("no decode-step sample found: is the host decode path on (not macOS, no PERCH_NO_HOST_HEAD)?")
    rows = rows[first:]
    parts, other = Counter(), Counter()
    for _, _, what in rows:
        for name, pattern in PARTS:
            if re.search(pattern, what):
                parts[name] += 1
                break
        else:
            parts["other"] += 1
            other[what.strip()[:90]] += 1
    span = rows[-1][1] - rows[0][1]
    busy = len(rows) / a.hz
    wall = span * a.cores
    bench = json.loads(open(a.bench).read().strip().splitlines()[-1])
    step = bench["rows"][0]
    print(f"{a.label}: {step['step_ms']:.1f} ms a step (median of {bench['steps']}), "
          f"{len(rows)} samples over {span:.2f} s on {a.cores} cores")
    print(f"{'part':<38}{'share of core time':>20}{'core-ms a step':>16}")
    steps = span * 1e3 / step["step_ms"]
    for name, n in parts.most_common():
        print(f"{name:<38}{n / a.hz / wall:>19.1%}{n / a.hz * 1e3 / steps:>16.2f}")
    idle = max(wall - busy, 0.0)
    print(f"{'idle (no thread on the core)':<38}{idle / wall:>19.1%}{idle * 1e3 / steps:>16.2f}")
    print("\nlargest 'other' symbols:")
    for what, n in other.most_common(8):
        print(f"  {n / len(rows):6.1%}  {what}")
    print(json.dumps({"label": a.label, "step_ms": step["step_ms"], "cores": a.cores,
                      "parts": {k: v / a.hz / wall for k, v in parts.items()}, "idle": idle / wall}))


if __name__ == "__main__":
    main()
