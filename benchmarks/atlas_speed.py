"""Training speed of a ~125M-parameter Atlas LM at T = 4096, beside Gated DeltaNet and Transformer++.

    python benchmarks/atlas_speed.py       # on a GPU -> benchmarks/results/atlas_speed.json
    python benchmarks/atlas_speed.py --small --out scratch/atlas_speed.json        # CPU smoke run, tiny models
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
        python benchmarks/atlas_speed.py --cpu --models atlas,atlas_chunk,gated_deltanet --out scratch/atlas_cpu.json

Every model is ``configs/<name>.yaml`` reshaped to the same ~125M shape (12 layers of
d_model 768, 12 heads, SwiGLU MLPs, a 50,304-row embedding tied to the head, bf16 compute),
trained by the project's own jitted train step (AdamW) on random tokens ``[batch, T]``
(``--small``: 2 layers of d_model 64 at T = 64 in float32, for CPU; ``--cpu``: 2 layers of d_model 128,
4 heads, T = 256, batch 2, float32, the byte-level vocabulary: the CPU speed target). For
each: parameters, median step time over ``--iters`` steps after ``--warmup``, training tokens/s
and the peak device memory (where the backend reports it); ``speed_vs_transformer`` and
``speed_vs_gated_deltanet``: tokens/s over that model's in the same run (``cpu_speed_vs_*``: the same
from the process CPU seconds of a step, every thread counted). ``atlas_chunk`` is Atlas with
``model.atlas.ns_granularity=chunk`` (``VARIANTS``). Models whose mixer is not registered
in this build (e.g. ``gated_deltanet`` before the recurrent mixers land) are listed as skipped.

Share of time in Newton–Schulz, measured two ways in the same run:

- ``ns_share_by_ablation`` = 1 - t(Atlas with ns_steps = 0) / t(Atlas): the step without NS;
- ``ns_share_by_timing``: the batched NS calls of one step (forward + backward, one call per
  chunk per layer, the momentum shapes of that model) timed on their own, over the step time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

from seqmodels.config import MeshConfig
from seqmodels.config_io import load_config
from seqmodels.mixers import MIXERS
from pallas_kernels.atlas_memory.memory import orthogonalize
from seqmodels.mixers.atlas import memory_layout
from seqmodels.optim.build import build_optimizer
from seqmodels.sharding import kernel_spec, make_mesh, param_logical_axes
from seqmodels.models import abstract_model
from seqmodels.training.state import count_params, init_train_state
from seqmodels.training.step import make_train_step

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = ("atlas", "gated_deltanet", "transformer")
# Variants measured by name: (the config they start from, their overrides).
VARIANTS = {"atlas_chunk": ("atlas", ("model.atlas.ns_granularity=chunk",))}
FULL = {"d_model": 768, "heads": 12, "layers": 12, "vocab": 50304, "seq_len": 4096, "batch": 2, "dtype": "bfloat16"}
SMALL = {"d_model": 64, "heads": 2, "layers": 2, "vocab": 512, "seq_len": 64, "batch": 2, "dtype": "float32"}
CPU = {"d_model": 128, "heads": 4, "layers": 2, "vocab": 320, "seq_len": 256, "batch": 2, "dtype": "float32"}


def model_config(name: str, shape: dict, extra=()):
    """``configs/<name>.yaml`` (or a ``VARIANTS`` entry's config and overrides) at the benchmark shape."""
    name, variant = VARIANTS.get(name, (name, ()))
    extra = (*variant, *extra)
    base = load_config(ROOT / "configs" / f"{name}.yaml")
    overrides = [f"model.mixers=[{base.model.mixers[0]}] * {shape['layers']}", f"model.d_model={shape['d_model']}",
                 f"model.num_heads={shape['heads']}", f"model.vocab_size={shape['vocab']}",
                 f"model.max_seq_len={shape['seq_len']}", f"data.seq_len={shape['seq_len']}",
                 f"model.compute_dtype={shape['dtype']}", "model.kernel_impl=auto", *extra]
    return load_config(ROOT / "configs" / f"{name}.yaml", overrides)


def _median_times(fn, warmup: int, iters: int) -> tuple[float, float]:
    """Median wall seconds and median process CPU seconds (all threads) of one call of ``fn``."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times, cpu_times = [], []
    for _ in range(iters):
        start, cpu_start = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return statistics.median(times), statistics.median(cpu_times)


def _median_seconds(fn, warmup: int, iters: int) -> float:
    return _median_times(fn, warmup, iters)[0]


def _peak_memory_bytes():
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def time_training(config, shape: dict, warmup: int, iters: int) -> dict:
    """Median step time of the jitted train step on random tokens, and what follows from it."""
    mesh = make_mesh(MeshConfig())
    _, abstract_state = abstract_model(config.model)
    optimizer, schedule = build_optimizer(
        config.optim, 1000, param_axes=param_logical_axes(abstract_state),
        param_shapes=jax.tree.map(lambda x: tuple(x.shape), nnx.to_pure_dict(abstract_state)))
    with jax.set_mesh(mesh):
        graphdef, state, _ = init_train_state(config.model, 0, mesh, optimizer)
        step = jax.jit(make_train_step(graphdef, optimizer, schedule), donate_argnums=0)
        tokens = jax.random.randint(jax.random.key(0), (shape["batch"], shape["seq_len"] + 1), 0, shape["vocab"])
        batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                 "loss_mask": jnp.ones((shape["batch"], shape["seq_len"]), jnp.float32)}
        params = count_params(state["params"])
        holder = {"state": state}

        def run():
            holder["state"], metrics = step(holder["state"], batch)
            return metrics["loss"]

        seconds, cpu_seconds = _median_times(run, warmup, iters)
    tokens_per_step = shape["batch"] * shape["seq_len"]
    return {"params": params, "step_seconds": seconds, "tokens_per_second": tokens_per_step / seconds,
            "step_cpu_seconds": cpu_seconds, "tokens_per_cpu_second": tokens_per_step / cpu_seconds,
            "peak_memory_bytes": _peak_memory_bytes()}


def time_newton_schulz(config, shape: dict, warmup: int, iters: int) -> float:
    """Seconds per train step spent in NS: one chunk's batched call (fwd + bwd) x chunks x layers."""
    atlas, layout = config.model.atlas, memory_layout(config.model)
    lead = (shape["batch"], atlas.chunk_size, shape["heads"])
    keys = jax.random.split(jax.random.key(1), len(layout.shapes))
    momenta = tuple(jax.random.normal(k, (*lead, m, n), jnp.float32) for k, (m, n) in zip(keys, layout.shapes))

    def forward(momenta):
        return orthogonalize(momenta, layout, steps=atlas.ns_steps, coefficients=atlas.ns_coefficients,
                             impl=config.model.kernel_impl, lead_spec=kernel_spec(("batch", None, "heads"), lead),
                             dtype=config.model.compute_dtype)

    @jax.jit
    def forward_backward(momenta):
        out, pullback = jax.vjp(forward, momenta)
        return pullback(out)

    per_call = _median_seconds(lambda: forward_backward(momenta), warmup, iters)
    chunks = -(-shape["seq_len"] // atlas.chunk_size)
    return per_call * chunks * shape["layers"]


def measure(name: str, shape: dict, args) -> dict:
    path = ROOT / "configs" / f"{VARIANTS.get(name, (name,))[0]}.yaml"
    if not path.is_file():
        return {"skipped": f"configs/{name}.yaml is not in this build"}
    base = load_config(path)
    if base.model.mixers[0] not in MIXERS:
        return {"skipped": f"mixer {base.model.mixers[0]!r} is not registered in this build"}
    try:
        result = time_training(model_config(name, shape), shape, args.warmup, args.iters)
        if name == "atlas":
            config = model_config(name, shape)
            without = time_training(model_config(name, shape, ["model.atlas.ns_steps=0"]), shape, args.warmup,
                                    args.iters)
            ns_seconds = time_newton_schulz(config, shape, args.warmup, args.iters)
            result.update(step_seconds_without_ns=without["step_seconds"],
                          ns_share_by_ablation=1.0 - without["step_seconds"] / result["step_seconds"],
                          ns_seconds_per_step=ns_seconds, ns_share_by_timing=ns_seconds / result["step_seconds"],
                          atlas=dataclasses.asdict(config.model.atlas))
        return result
    except Exception as error:  # noqa: BLE001  (an out-of-memory model must not lose the others' numbers)
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--small", action="store_true", help="tiny models at T = 64 (a CPU smoke run)")
    shapes.add_argument("--cpu", action="store_true", help="d_model 128, 4 heads, 2 layers, T = 256, batch 2 (CPU)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated config names")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "atlas_speed.json"))
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    shape = SMALL if args.small else CPU if args.cpu else FULL
    report = {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(), "shape": shape,
              "jax": jax.__version__, "models": {}}
    for name in (n.strip() for n in args.models.split(",") if n.strip()):
        report["models"][name] = measure(name, shape, args)
        print(name, json.dumps(report["models"][name], default=str), flush=True)
    for baseline in ("transformer", "gated_deltanet"):
        reference = report["models"].get(baseline, {}).get("tokens_per_second")
        for result in report["models"].values():
            if reference and "tokens_per_second" in result:
                result[f"speed_vs_{baseline}"] = result["tokens_per_second"] / reference
        cpu_reference = report["models"].get(baseline, {}).get("tokens_per_cpu_second")
        for result in report["models"].values():
            if cpu_reference and "tokens_per_cpu_second" in result:
                result[f"cpu_speed_vs_{baseline}"] = result["tokens_per_cpu_second"] / cpu_reference
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
