"""Newton–Schulz: the XLA path and the fused Pallas kernel, timed side by side in one run.

    python benchmarks/newton_schulz_bench.py [--small] [--out results/newton_schulz.json]

Default cases (bf16, 5 "muon" steps): 1024 x 128x128, 256 x 64x64, 64 x 1024x1024, 4096x4096.
``--small`` runs two tiny cases, a smoke run for CPU (where the Pallas kernel is interpreted, so
its times mean nothing). Each time is the median of ``--iters`` calls after ``--warmup`` calls.
FLOPs per step for an m x n matrix with m <= n: 4 m^2 n + 2 m^3 (X X^T, A A, (bA + cAA) X).
Before timing, the Pallas output is checked against the XLA output (max abs difference, recorded).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from pallas_kernels import newton_schulz  # noqa: E402

STEPS = 5
DEFAULT_SHAPES = ((1024, 128, 128), (256, 64, 64), (64, 1024, 1024), (4096, 4096))
SMALL_SHAPES = ((4, 32, 32), (2, 16, 48))
IMPLS = ("xla", "pallas")


def flops(shape: tuple[int, ...], steps: int = STEPS) -> int:
    """Matmul FLOPs of ``steps`` steps on a stack of matrices of ``shape`` [..., M, N]."""
    m, n = sorted(shape[-2:])
    return math.prod(shape[:-2]) * steps * (4 * m * m * n + 2 * m**3)


def cases(small: bool) -> list[dict]:
    """One dict per (shape, impl): op, impl, shape, fn (zero-argument, returns the output), flops."""
    shapes = SMALL_SHAPES if small else DEFAULT_SHAPES
    result = []
    for index, shape in enumerate(shapes):
        x = jax.random.normal(jax.random.PRNGKey(index), shape, jnp.float32).astype(jnp.bfloat16)
        for impl in IMPLS:
            run = jax.jit(lambda x, impl=impl: newton_schulz(x, steps=STEPS, impl=impl))
            fn = lambda run=run, x=x: run(x)
            case = {"op": "newton_schulz", "impl": impl, "shape": shape, "fn": fn, "flops": flops(shape)}
            result.append(case)
    return result


def median_ms(fn, warmup: int, iters: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(small: bool, warmup: int, iters: int) -> list[dict]:
    """Time every case; records carry shape, impl, ms, TFLOP/s and, for pallas, the speed-up."""
    records, xla_out, xla_ms = [], {}, {}
    for case in cases(small):
        shape, impl = tuple(case["shape"]), case["impl"]
        out = jax.block_until_ready(case["fn"]())
        ms = median_ms(case["fn"], warmup, iters)
        record = {"op": case["op"], "shape": list(shape), "impl": impl, "dtype": "bfloat16", "steps": STEPS,
                  "ms": ms, "tflops": case["flops"] / (ms * 1e-3) / 1e12}
        if impl == "xla":
            xla_out[shape], xla_ms[shape] = out, ms
        else:
            diff = jnp.max(jnp.abs(out.astype(jnp.float32) - xla_out[shape].astype(jnp.float32)))
            record["max_abs_diff_vs_xla"] = float(diff)
            record["speedup_vs_xla"] = xla_ms[shape] / ms
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes: a CPU smoke run")
    parser.add_argument("--out", default="results/newton_schulz.json", help="JSON file to write")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    records = run(args.small, args.warmup, args.iters)
    device = jax.devices()[0].device_kind
    header = {"backend": jax.default_backend(), "device": device, "jax": jax.__version__}
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**header, "results": records}, indent=1))
    for r in records:
        extra = f"  x{r['speedup_vs_xla']:.2f} vs xla" if "speedup_vs_xla" in r else ""
        shape = str(tuple(r["shape"]))
        print(f"{shape:>20} {r['impl']:>7} {r['ms']:9.3f} ms {r['tflops']:8.2f} TFLOP/s{extra}")
    return records


if __name__ == "__main__":
    main()
