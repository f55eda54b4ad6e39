"""Kernel benchmarks: every impl of an op side by side in one run, written to JSON.

    python benchmarks/kernels.py --ops linear_scan,chunk_gla,gated_delta_rule,newton_schulz \
        --out benchmarks/results/kernels.json
    python benchmarks/kernels.py --small            # CPU smoke run (interpret-mode Pallas)

Each op contributes ``Case``s through a builder in ``kernel_cases.CASE_BUILDERS``; a case holds its inputs and
a table of named forward functions (the impls plus same-run baselines such as a copy). For each
function the run reports the median of ``--repeats`` timed calls after a warm-up (compilation),
forward and forward+backward (grad of ``sum(out * cotangent)`` w.r.t. every float input), tokens/s,
and, where the case defines them, effective bandwidth (bytes that must move / time) or FLOP rate.
Default sizes are the H200 anchor shapes; absolute times mean something only on an accelerator.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

from benchmarks.kernel_cases import CASE_BUILDERS, Case


def median_seconds(fn, args, repeats: int) -> float:
    """Median wall time of `repeats` calls of `fn(*args)` after one warm-up call (compilation)."""
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _forward_backward(fn, num_args: int):
    """jit(grad of sum(out * cotangent)) w.r.t. every input, cotangent fixed by the output's shape."""

    def loss(*args):
        out = fn(*args).astype(jnp.float32)
        return jnp.sum(out * jnp.cos(jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape)))

    return jax.jit(jax.grad(loss, argnums=tuple(range(num_args))))


def run_case(case: Case, repeats: int) -> list[dict]:
    """Time every function of ``case``; one record per function."""
    args = case.make_inputs()
    records = []
    for name, fn in case.functions.items():
        record = dict(op=case.op, impl=name, shape=case.shape, dtype=case.dtype)
        forward = median_seconds(jax.jit(fn), args, repeats)
        record["fwd_ms"] = 1e3 * forward
        if case.tokens:
            record["fwd_tokens_per_s"] = case.tokens / forward
        if case.bytes_moved is not None:
            bytes_moved = case.bytes_moved_by.get(name, case.bytes_moved)
            record["fwd_GBps_effective"] = bytes_moved / forward / 1e9
        if case.flops is not None:
            record["fwd_TFLOPs"] = case.flops / forward / 1e12
        if name not in case.forward_only:
            both = median_seconds(_forward_backward(fn, len(args)), args, repeats)
            record["fwdbwd_ms"] = 1e3 * both
            if case.tokens:
                record["fwdbwd_tokens_per_s"] = case.tokens / both
        records.append(record)
    first = records[0]
    for record in records:  # ratios against the case's first function, measured in this run
        record[f"fwd_time_vs_{first['impl']}"] = record["fwd_ms"] / first["fwd_ms"]
        if "fwd_GBps_effective" in record:
            record[f"fwd_bandwidth_vs_{first['impl']}"] = record["fwd_GBps_effective"] / first["fwd_GBps_effective"]
    return records


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(CASE_BUILDERS), help="comma-separated ops to run")
    parser.add_argument("--small", action="store_true", help="small shapes (CPU smoke run)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per function")
    parser.add_argument("--impls", default=None, help="comma-separated subset of function names to run")
    parser.add_argument("--out", default=None, help="JSON file for the records")
    args = parser.parse_args(argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)

    unknown = sorted(set(args.ops.split(",")) - set(CASE_BUILDERS))
    if unknown:
        parser.error(f"unknown ops {unknown}; known: {sorted(CASE_BUILDERS)}")
    records = []
    for op in args.ops.split(","):
        for case in CASE_BUILDERS[op](args.small):
            if args.impls:
                chosen = {n: f for n, f in case.functions.items() if n.split(" ")[0] in args.impls.split(",")}
                case = dataclasses.replace(case, functions=chosen)
            for record in run_case(case, args.repeats):
                print(json.dumps(record), flush=True)
                records.append(record)
    result = dict(backend=jax.default_backend(), devices=[str(d) for d in jax.devices()], records=records)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return records


if __name__ == "__main__":
    main()
