"""Timing cases for ``pallas_kernels.gated_delta_rule``: forward and forward+backward per impl.

``cases(small)`` returns one dict per (impl, shape): ``op``, ``impl``, ``shape``, ``fn_fwd`` and
``fn_fwd_bwd`` (jitted callables of no arguments returning arrays) and ``tokens`` (B * T).
Run as a script to time them (median of ``--iters`` calls after warm-up, ``block_until_ready``)
and write JSON::

    python -m benchmarks.gated_delta_rule_bench --out gdr.json          # GPU: B8 T4096 H16 K=V=128 bf16
    python -m benchmarks.gated_delta_rule_bench --small --out gdr.json  # CPU smoke run

The H200 targets: forward >= 27M tokens/s (flash-linear-attention's Triton kernel, 1.19 ms at
the large shape), forward+backward >= 3x the ``xla`` impl measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from pallas_kernels import gated_delta_rule

LARGE = (8, 4096, 16, 128, 128)  # B, T, H, K, V
SMALL = (1, 128, 2, 32, 32)


def _inputs(shape, dtype, seed=0):
    """k L2-normalised, beta in (0, 1), log decay in (-inf, 0): the usual Gated DeltaNet gates."""
    batch, length, heads, key_dim, value_dim = shape
    keys = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(keys[0], (batch, length, heads, key_dim), dtype)
    k = jax.random.normal(keys[1], (batch, length, heads, key_dim), jnp.float32)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
    v = jax.random.normal(keys[2], (batch, length, heads, value_dim), dtype)
    beta = jax.nn.sigmoid(jax.random.normal(keys[3], (batch, length, heads))).astype(dtype)
    log_decay = jax.nn.log_sigmoid(4.0 + jax.random.normal(keys[4], (batch, length, heads)))
    return q, k, v, beta, log_decay.astype(dtype)


def _case(impl, shape, dtype, chunk_size):
    arrays = _inputs(shape, dtype)

    def forward(q, k, v, beta, log_decay):
        return gated_delta_rule(q, k, v, beta, log_decay, chunk_size=chunk_size, impl=impl)[0]

    def loss(q, k, v, beta, log_decay):
        return jnp.sum(forward(q, k, v, beta, log_decay).astype(jnp.float32))

    fwd = jax.jit(forward)
    fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
    return {
        "op": "gated_delta_rule",
        "impl": impl,
        "shape": dict(zip("BTHKV", shape), dtype=jnp.dtype(dtype).name, chunk_size=chunk_size),
        "fn_fwd": lambda: fwd(*arrays),
        "fn_fwd_bwd": lambda: fwd_bwd(*arrays),
        "tokens": shape[0] * shape[1],
    }


def cases(small: bool) -> list[dict]:
    """``small``: a CPU-sized shape (Pallas in interpret mode); else the H200 target shape."""
    if small:
        return [_case(impl, SMALL, jnp.float32, 32) for impl in ("xla", "pallas")]
    return [_case(impl, LARGE, jnp.bfloat16, 64) for impl in ("xla", "pallas")]


def time_ms(fn, iters: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds, after ``warmup`` calls (compilation)."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def run(small: bool, iters: int) -> list[dict]:
    results = []
    for case in cases(small):
        fwd_ms = time_ms(case["fn_fwd"], iters)
        fwd_bwd_ms = time_ms(case["fn_fwd_bwd"], iters)
        results.append(
            {
                "op": case["op"],
                "impl": case["impl"],
                "shape": case["shape"],
                "backend": jax.default_backend(),
                "device": jax.devices()[0].device_kind,
                "fwd_ms": fwd_ms,
                "fwd_bwd_ms": fwd_bwd_ms,
                "fwd_tokens_per_s": case["tokens"] / fwd_ms * 1e3,
                "fwd_bwd_tokens_per_s": case["tokens"] / fwd_bwd_ms * 1e3,
            }
        )
        print(
            f"{case['impl']:>8}  fwd {fwd_ms:9.3f} ms  {results[-1]['fwd_tokens_per_s'] / 1e6:8.2f} M tok/s"
            f"   fwd+bwd {fwd_bwd_ms:9.3f} ms",
            flush=True,
        )
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="CPU-sized smoke run")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per measurement")
    parser.add_argument("--out", default="gated_delta_rule_bench.json", help="JSON output path")
    args = parser.parse_args()
    results = run(args.small, args.iters)
    by_impl = {r["impl"]: r for r in results}
    if {"xla", "pallas"} <= by_impl.keys():
        ratio = by_impl["xla"]["fwd_bwd_ms"] / by_impl["pallas"]["fwd_bwd_ms"]
        print(f"pallas fwd+bwd speed-up over xla: {ratio:.2f}x")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
