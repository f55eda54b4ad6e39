"""Kernel benchmarks: every impl of an op side by side in one run, written to JSON.

    python benchmarks/kernels.py --ops linear_scan,chunk_gla --out results.json
    python benchmarks/kernels.py --small            # CPU smoke run (interpret-mode Pallas)

Each op contributes ``Case``s through a builder in ``CASE_BUILDERS``; a case holds its inputs and
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
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pallas_kernels import chunk_gla, linear_scan  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Case:
    """One shape of one op: inputs, the functions to time, and what a call must do."""

    op: str
    shape: dict
    dtype: str
    make_inputs: Callable[[], tuple]
    functions: dict[str, Callable]
    tokens: int
    bytes_moved: int | None = None  # bytes a call must read + write at least (bandwidth cases)
    bytes_moved_by: dict[str, int] = dataclasses.field(default_factory=dict)  # per-function overrides
    flops: float | None = None  # FLOPs of one forward call (compute cases)
    forward_only: tuple[str, ...] = ()  # functions with no meaningful backward (baselines)


def _random(key, shape, dtype, low=None, high=None):
    if low is None:
        return jax.random.normal(key, shape).astype(dtype)
    return jax.random.uniform(key, shape, minval=low, maxval=high).astype(dtype)


def _linear_scan_cases(small: bool) -> list[Case]:
    batch, steps, channels = (2, 256, 64) if small else (4, 8192, 4096)
    dtype = jnp.float32

    def make_inputs():
        key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
        shape = (batch, steps, channels)
        return _random(key_a, shape, dtype, 0.5, 1.0), _random(key_b, shape, dtype)

    def scan_with(impl):
        return lambda a, b: linear_scan(a, b, impl=impl)

    functions = {
        "copy (x + 1)": lambda a, b: a + 1,
        "xla (associative_scan)": scan_with("xla"),
        "pallas": scan_with("pallas"),
    }
    if small:
        functions["reference (lax.scan)"] = scan_with("reference")
    element_bytes = jnp.dtype(dtype).itemsize
    return [
        Case(
            op="linear_scan",
            shape=dict(B=batch, T=steps, D=channels),
            dtype=jnp.dtype(dtype).name,
            make_inputs=make_inputs,
            functions=functions,
            tokens=batch * steps,
            bytes_moved=3 * batch * steps * channels * element_bytes,  # read a, b; write h
            bytes_moved_by={"copy (x + 1)": 2 * batch * steps * channels * element_bytes},
            forward_only=("copy (x + 1)",),
        )
    ]


def _chunk_gla_cases(small: bool) -> list[Case]:
    batch, steps, heads, key_dim, value_dim = (1, 128, 2, 32, 32) if small else (8, 4096, 16, 128, 128)
    chunk_size = 16 if small else 64
    dtype = jnp.bfloat16
    cases = []
    for vector_decay in (False, True):

        def make_inputs(vector_decay=vector_decay):
            keys = jax.random.split(jax.random.PRNGKey(0), 4)
            decay_shape = (batch, steps, heads) + ((key_dim,) if vector_decay else ())
            return (
                _random(keys[0], (batch, steps, heads, key_dim), dtype),
                _random(keys[1], (batch, steps, heads, key_dim), dtype),
                _random(keys[2], (batch, steps, heads, value_dim), dtype),
                _random(keys[3], decay_shape, jnp.float32, -0.2, -0.001),
            )

        def gla_with(impl):
            return lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=chunk_size, impl=impl)[0]

        functions = {"xla": gla_with("xla"), "pallas": gla_with("pallas")}
        if small:
            functions["reference"] = gla_with("reference")
        # Chunked algorithm per token: q k^T and A v within the chunk, q S and k^T v across chunks.
        flops_per_token = 2 * chunk_size * (key_dim + value_dim) + 4 * key_dim * value_dim
        cases.append(
            Case(
                op="chunk_gla",
                shape=dict(B=batch, T=steps, H=heads, K=key_dim, V=value_dim, chunk=chunk_size,
                           decay="per key channel" if vector_decay else "per head"),
                dtype=jnp.dtype(dtype).name,
                make_inputs=make_inputs,
                functions=functions,
                tokens=batch * steps,
                flops=float(flops_per_token * batch * steps * heads),
            )
        )
    return cases


# Add an op here: a builder returning its cases (gated_delta_rule, newton_schulz, ...).
CASE_BUILDERS: dict[str, Callable[[bool], list[Case]]] = {
    "linear_scan": _linear_scan_cases,
    "chunk_gla": _chunk_gla_cases,
}


def _median_seconds(fn, args, repeats: int) -> float:
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
        forward = _median_seconds(jax.jit(fn), args, repeats)
        record.update(fwd_ms=1e3 * forward, fwd_tokens_per_s=case.tokens / forward)
        if case.bytes_moved is not None:
            bytes_moved = case.bytes_moved_by.get(name, case.bytes_moved)
            record["fwd_GBps_effective"] = bytes_moved / forward / 1e9
        if case.flops is not None:
            record["fwd_TFLOPs"] = case.flops / forward / 1e12
        if name not in case.forward_only:
            both = _median_seconds(_forward_backward(fn, len(args)), args, repeats)
            record.update(fwdbwd_ms=1e3 * both, fwdbwd_tokens_per_s=case.tokens / both)
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
