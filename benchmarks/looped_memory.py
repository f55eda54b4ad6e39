"""Peak memory of the looped model's train step against the loop count, with and without remat.

    python benchmarks/looped_memory.py [--config configs/looped_cfl.yaml] [--loops 4,32] [--length 128]
                                       [--batch-size 32] [--out benchmarks/results/looped_memory] [key=value ...]

Compiles (does not run) the jitted train step of ``seqmodels.training.step`` (AdamW update included)
for the config's model with ``loop_schedule: fixed`` at each loop count and ``model.remat`` in
{full, none}, on a batch of rows of ``length + 2`` tokens, and reads XLA's memory plan:
``temp_size_in_bytes`` is the scratch (activations saved for the backward pass, intermediates) on top
of the arguments and outputs (parameters, optimizer state, batch), which do not depend on the loop
count. With remat per loop iteration, each extra loop should add only the iteration's input
``[B, T, D]`` that the scan keeps for the backward pass; without remat, it adds the block's
internals (attention scores ``[B, H, T, T]``, MLP hidden ``[B, T, F]``).

Writes ``<out>/memory.json`` and ``<out>/memory.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def compiled_train_step_memory(config, loops: int, remat: str, batch_size: int, length: int) -> dict:
    """XLA's memory plan (bytes) of the train step of ``config.model`` run ``loops`` times, ``remat`` policy."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from seqmodels.models import build_model
    from seqmodels.optim.build import build_optimizer
    from seqmodels.training.step import make_train_step

    looped = dataclasses.replace(config.model.looped, loop_schedule="fixed", fixed_loops=loops)
    model_config = dataclasses.replace(config.model, looped=looped, remat=remat)
    graphdef, params = nnx.split(build_model(model_config), nnx.Param)
    optimizer, schedule = build_optimizer(config.optim, config.train.steps)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optimizer.init(params)}
    shape = (batch_size, length + 2)
    batch = {"inputs": jnp.ones(shape, jnp.int32), "targets": jnp.ones(shape, jnp.int32),
             "loss_mask": jnp.ones(shape, jnp.float32), "segment_ids": jnp.ones(shape, jnp.int32)}
    step = jax.jit(make_train_step(graphdef, optimizer, schedule))
    analysis = step.lower(state, batch).compile().memory_analysis()
    return {"loops": loops, "remat": remat, "temp_bytes": int(analysis.temp_size_in_bytes),
            "argument_bytes": int(analysis.argument_size_in_bytes),
            "output_bytes": int(analysis.output_size_in_bytes)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "looped_cfl.yaml"))
    parser.add_argument("--loops", default="4,32", help="loop counts to compare")
    parser.add_argument("--length", type=int, default=128, help="string length N (rows of N + 2 tokens)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default=str(RESULTS / "looped_memory"))
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    from seqmodels.config_io import load_config
    from seqmodels.models.looped import num_padding
    config = load_config(args.config, args.overrides)
    rows = [compiled_train_step_memory(config, int(loops), remat, args.batch_size, args.length)
            for remat in ("full", "none") for loops in args.loops.split(",")]
    model = config.model
    positions = args.length + 2 + num_padding(model.looped, args.length)
    report = {"command": " ".join(["python", "benchmarks/looped_memory.py", *(sys.argv[1:] if argv is None else argv)]),
              "batch_size": args.batch_size, "length": args.length, "positions": positions,
              "d_model": model.d_model, "num_heads": model.num_heads,
              "residual_stream_bytes": args.batch_size * positions * model.d_model * 4, "rows": rows}
    lines = [f"Train-step scratch memory (XLA `temp_size_in_bytes`, compiled on CPU), batch {args.batch_size}, "
             f"N = {args.length} ({positions} positions), d_model {model.d_model}; one residual stream "
             f"[B, T, D] = {report['residual_stream_bytes'] / 2**20:.2f} MiB.", "",
             "| remat | loops | temp MiB | arguments MiB |", "|---|---|---|---|"]
    lines += [f"| {row['remat']} | {row['loops']} | {row['temp_bytes'] / 2**20:.2f} | "
              f"{row['argument_bytes'] / 2**20:.2f} |" for row in rows]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(report, indent=2))
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
