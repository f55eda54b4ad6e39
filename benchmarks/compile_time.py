"""Compile time of the train step against depth, with and without ``model.scan_layers``.

    python benchmarks/compile_time.py                       # -> benchmarks/results/compile_time.json
    python benchmarks/compile_time.py --layers 6,12 --mixers attention --out scratch/compile.json

Each case lowers and compiles the real train step (``seqmodels.training.step``, AdamW) of a decoder
LM (d_model 256, 4 heads, vocabulary 256) whose ``model.mixers`` is one group repeated to the given
depth (``attention``: Transformer++; ``gated_deltanet``; ``atlas``), on abstract inputs of
``--batch`` x ``--seq-len`` tokens: nothing runs, only XLA's compilation is timed (wall seconds,
best of ``--repeats`` in fresh processes so no cache is shared). The JSON holds one row per case
and, per mixer and depth, the ratio unrolled / scanned.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def compile_seconds(mixer: str, layers: int, scanned: bool, batch: int, seq_len: int) -> float:
    """Seconds to compile one train step (this process)."""
    import time

    import jax
    from flax import nnx

    from seqmodels.config import ModelConfig, OptimConfig
    from seqmodels.optim.build import build_optimizer
    from seqmodels.sharding import param_logical_axes
    from seqmodels.models import abstract_model
    from seqmodels.training.step import make_train_step

    config = ModelConfig(d_model=256, num_heads=4, vocab_size=256, mixers=(mixer,) * layers, max_seq_len=seq_len,
                         scan_layers=scanned, kernel_impl="xla")
    graphdef, abstract_state = abstract_model(config)
    params = nnx.to_pure_dict(abstract_state)
    optimizer, schedule = build_optimizer(OptimConfig(), 100, param_axes=param_logical_axes(abstract_state),
                                          param_shapes=jax.tree.map(lambda x: tuple(x.shape), params))
    state = {"step": jax.ShapeDtypeStruct((), "int32"), "params": params,
             "opt_state": jax.eval_shape(optimizer.init, params)}
    rows = jax.ShapeDtypeStruct((batch, seq_len), "int32")
    batch_spec = {"inputs": rows, "targets": rows, "segment_ids": rows, "positions": rows,
                  "loss_mask": jax.ShapeDtypeStruct((batch, seq_len), "float32")}
    step = jax.jit(make_train_step(graphdef, optimizer, schedule, grad_accum=1))
    lowered = step.lower(state, batch_spec)
    start = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - start


def _case_in_subprocess(mixer: str, layers: int, scanned: bool, args) -> float:
    code = ("import sys, json; from benchmarks.compile_time import compile_seconds; "
            f"print(json.dumps(compile_seconds({mixer!r}, {layers}, {scanned}, {args.batch}, {args.seq_len})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{mixer} x {layers} (scanned={scanned}) failed:\n{result.stderr[-3000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixers", default="attention,gated_deltanet")
    parser.add_argument("--layers", default="6,12,24,48")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS / "compile_time.json"))
    args = parser.parse_args(argv)
    depths = [int(x) for x in args.layers.split(",")]
    if any(d < 1 for d in depths) or args.repeats < 1 or args.batch < 1 or args.seq_len < 1:
        parser.error("--layers, --repeats, --batch and --seq-len must be positive")
    rows, ratios = [], {}
    for mixer in args.mixers.split(","):
        for layers in depths:
            times = {}
            for scanned in (False, True):
                times[scanned] = min(_case_in_subprocess(mixer, layers, scanned, args) for _ in range(args.repeats))
                rows.append({"mixer": mixer, "layers": layers, "scan_layers": scanned, "compile_seconds": times[scanned]})
                print(f"{mixer:16s} {layers:3d} layers  scan_layers={scanned!s:5s}  {times[scanned]:7.2f} s", flush=True)
            ratios[f"{mixer} x {layers}: unrolled / scanned"] = times[False] / times[True]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["python", "benchmarks/compile_time.py", *(argv or sys.argv[1:])]),
                               "platform": platform.platform(), "batch": args.batch, "seq_len": args.seq_len,
                               "rows": rows, "ratios": ratios}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
