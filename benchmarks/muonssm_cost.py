"""Cost of MuonSSM's momentum recurrences against their backbones' kernels: forward + backward, one run.

    OPENBLAS_NUM_THREADS=1 python benchmarks/muonssm_cost.py --out benchmarks/results/muonssm_cost/muonssm_cost.json
    python benchmarks/muonssm_cost.py --small --out scratch/cost.json        # seconds, for a smoke test

For one shape (per head K = V, chunk 64) it times the gradient of ``sum(o * cotangent)`` with
respect to every input of:

- ``gated_delta_rule`` (impl xla: the Gated DeltaNet chunk form) and ``momentum_delta_rule``
  (MuonSSM on Gated DeltaNet: the same UT chunk form extended by the momentum input), plus
  ``momentum_delta_rule_reference`` (the exact token-by-token recurrence, for scale);
- ``chunk_gla`` (impl xla: SSD, the Mamba2 form) and ``momentum_scalar_decay`` (MuonSSM on Mamba2),
  plus ``momentum_scalar_decay_reference``.

It reports the median of ``--repeats`` calls after a warm-up and the ratios momentum / backbone,
as JSON (``--out``) and as a markdown table next to it (same name, ``.md``).
All are pure JAX here; on a GPU the backbones would also have Pallas kernels.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shlex
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see experiments/recall/run.py

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import median_seconds  # noqa: E402
from pallas_kernels import chunk_gla, gated_delta_rule  # noqa: E402
from pallas_kernels.momentum_scan import momentum_delta_rule, momentum_scalar_decay  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "muonssm_cost"


def make_inputs(batch, length, heads, width):
    keys = jax.random.split(jax.random.key(0), 6)
    q = jax.random.normal(keys[0], (batch, length, heads, width))
    k = jax.random.normal(keys[1], (batch, length, heads, width))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(keys[2], (batch, length, heads, width))
    beta = jax.nn.sigmoid(jax.random.normal(keys[3], (batch, length, heads)))
    log_decay = -0.1 * jax.random.uniform(keys[4], (batch, length, heads))
    log_momentum = jnp.full((batch, length, heads), jnp.log(0.9))
    return q, k, v, beta, log_decay, log_momentum


def functions(chunk_size: int):
    scale = 0.125
    return {
        "gated_delta_rule (xla)": lambda q, k, v, beta, g, h: gated_delta_rule(
            q, k, v, beta, g, scale=scale, chunk_size=chunk_size, impl="xla")[0],
        "momentum_delta_rule (chunked)": lambda q, k, v, beta, g, h: momentum_delta_rule(
            q, k, v, beta, g, h, scale=scale, chunk_size=chunk_size, impl="xla")[0],
        "momentum_delta_rule_reference (token scan)": lambda q, k, v, beta, g, h: (
            momentum_delta_rule(q, k, v, beta, g, h, scale=scale, impl="reference")[0]),
        "chunk_gla (xla)": lambda q, k, v, beta, g, h: chunk_gla(q, k, v, g, scale=scale, chunk_size=chunk_size,
                                                                 impl="xla")[0],
        "momentum_scalar_decay (chunked)": lambda q, k, v, beta, g, h: momentum_scalar_decay(
            q, k, v, g, h, scale=scale, chunk_size=chunk_size, impl="xla")[0],
        "momentum_scalar_decay_reference (token scan)": lambda q, k, v, beta, g, h: (
            momentum_scalar_decay(q, k, v, g, h, scale=scale, impl="reference")[0]),
    }


RATIOS = {  # label: (numerator, denominator)
    "momentum_delta_rule / gated_delta_rule": ("momentum_delta_rule (chunked)", "gated_delta_rule (xla)"),
    "token-scan momentum delta rule / gated_delta_rule": ("momentum_delta_rule_reference (token scan)",
                                                          "gated_delta_rule (xla)"),
    "momentum_scalar_decay / chunk_gla": ("momentum_scalar_decay (chunked)", "chunk_gla (xla)"),
    "token-scan momentum scalar decay / chunk_gla": ("momentum_scalar_decay_reference (token scan)",
                                                     "chunk_gla (xla)"),
}


def time_gradient(fn, inputs, repeats: int) -> float:
    cotangent = jax.random.normal(jax.random.key(1), inputs[2].shape)
    grad = jax.jit(jax.grad(lambda *x: jnp.sum(fn(*x) * cotangent), argnums=tuple(range(6))))
    return median_seconds(grad, inputs, repeats)


def markdown(report: dict, command: str) -> str:
    """The timings and ratios of ``report`` as a markdown table, with the command that produced them."""
    shape = ", ".join(f"{k}={v}" for k, v in report["shape"].items())
    lines = [f"MuonSSM momentum recurrences vs their backbones: forward + backward, median of {report['repeats']} "
             f"calls, shape {shape}, chunk {report['chunk_size']}, {report['device']}.", "",
             f"Command: `{command}`", "", "| function | ms (forward + backward) |", "|---|---:|"]
    lines += [f"| {name} | {seconds * 1e3:.2f} |" for name, seconds in report["seconds_forward_backward"].items()]
    lines += ["", "| ratio | x |", "|---|---:|"]
    lines += [f"| {name} | {ratio:.2f} |" for name, ratio in report["ratios"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="4,1024,4,64", help="B,T,H,K (K = V)")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="tiny shape for a smoke test")
    parser.add_argument("--only", default="", help="comma-separated function names to time (default: all)")
    parser.add_argument("--out", default=str(RESULTS / "muonssm_cost.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    shape = (1, 64, 2, 16) if args.small else tuple(int(x) for x in args.shape.split(","))
    inputs = make_inputs(*shape)
    table = functions(16 if args.small else args.chunk_size)
    wanted = [name.strip() for name in args.only.split(",") if name.strip()] or list(table)
    unknown = sorted(set(wanted) - set(table))
    if unknown:
        parser.error(f"--only: unknown {unknown}; known: {list(table)}")
    seconds = {}
    for name in wanted:
        seconds[name] = time_gradient(table[name], inputs, 1 if args.small else args.repeats)
        print(f"{name:>45}: {seconds[name] * 1e3:9.2f} ms forward+backward", flush=True)
    ratios = {label: seconds[top] / seconds[bottom] for label, (top, bottom) in RATIOS.items()
              if top in seconds and bottom in seconds}
    for name, ratio in ratios.items():
        print(f"{name:>55}: {ratio:.2f}x")
    report = {"shape": dict(zip("BTHK", shape)), "chunk_size": 16 if args.small else args.chunk_size,
              "repeats": 1 if args.small else args.repeats, "device": jax.devices()[0].device_kind,
              "platform": platform.platform(), "seconds_forward_backward": seconds, "ratios": ratios}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    command = shlex.join(["python", "benchmarks/muonssm_cost.py", *(sys.argv[1:] if argv is None else argv)])
    out.with_suffix(".md").write_text(markdown(report, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
