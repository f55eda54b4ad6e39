"""Training-step speed and memory of a ~125M-parameter LM per mixer, impl=pallas beside impl=xla and Transformer++.

    python benchmarks/train_step.py     # on a GPU -> benchmarks/results/train_step.json
    python benchmarks/train_step.py --small --out scratch/train_step.json             # CPU smoke run
    python benchmarks/train_step.py --mixers mamba2,attention --seq-lens 4096 --isolate

Each case is one mixer in every layer of the decoder LM (``--layers`` x (mixer + SwiGLU MLP),
d_model 768, 12 heads, vocabulary 50304, bf16 compute: ~125M parameters), one ``model.kernel_impl``
(``pallas`` or ``xla``; attention has none and runs once), and one sequence length T with
``--tokens-per-step`` tokens per step (batch = tokens / T). A case jits the real train step
(``seqmodels.training.step``, AdamW), runs ``--warmup`` steps, then times ``--steps`` steps and reports
the median step time, training tokens/s, the compiled step's memory (arguments + outputs + temporaries,
from XLA's memory analysis) and, on devices that report it, the device's peak bytes in use (per case
with ``--isolate``, which runs every case in its own process; else the process-wide peak so far).
The JSON ends with ratios per mixer and T: ``pallas / xla`` tokens/s and ``pallas / Transformer++``.
MuonSSM's momentum recurrences are pure JAX: for them ``pallas`` only switches the layers' other
kernels (none), so their two rows measure the same program. Absolute numbers mean something only
on an accelerator; ``--small`` checks the plumbing on CPU (Pallas in interpret mode).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

DEFAULT_MIXERS = "attention,mamba2,deltanet,gated_deltanet,muonssm_mamba2,muonssm_gated_deltanet"
FULL = dict(d_model=768, num_heads=12, layers=12, vocab_size=50304, dtype="bfloat16", mamba2_head_dim=64)
SMALL = dict(d_model=64, num_heads=2, layers=2, vocab_size=256, dtype="float32", mamba2_head_dim=0)


def model_config(args, mixer: str, impl: str, seq_len: int):
    from seqmodels.config import ModelConfig
    from seqmodels.mixers.mamba2 import Mamba2Config
    shape = SMALL if args.small else FULL
    return ModelConfig(vocab_size=shape["vocab_size"], d_model=shape["d_model"], num_heads=shape["num_heads"],
                       mixers=(mixer,) * (args.layers or shape["layers"]), max_seq_len=seq_len,
                       compute_dtype=shape["dtype"], kernel_impl="auto" if impl == "n/a" else impl, remat=args.remat,
                       mamba2=Mamba2Config(head_dim=shape["mamba2_head_dim"]))


def _memory(compiled) -> int | None:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
               - analysis.alias_size_in_bytes)


def time_steps(compiled, state, batch, warmup: int, steps: int) -> tuple[float, dict]:
    """Median seconds of ``steps`` calls of the compiled (state-donating) step after ``warmup`` calls, and the
    last call's metrics."""
    import jax
    for _ in range(warmup):
        state, metrics = compiled(state, batch)
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return statistics.median(times), metrics


def run_case(args, mixer: str, impl: str, seq_len: int) -> dict:
    """Time one case in this process (see the module docstring)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from seqmodels.models import build_model, flops_per_token
    from seqmodels.training.step import make_train_step

    config = model_config(args, mixer, impl, seq_len)
    batch_size = max(1, args.tokens_per_step // seq_len)
    model = build_model(config, seed=0)
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    optimizer = optax.adamw(1e-4)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optimizer.init(params)}
    tokens = jax.random.randint(jax.random.key(0), (batch_size, seq_len + 1), 0, config.vocab_size)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": jnp.ones((batch_size, seq_len))}
    step = jax.jit(make_train_step(graphdef, optimizer, lambda count: 1e-4), donate_argnums=0)
    compiled = step.lower(state, batch).compile()
    step_time, metrics = time_steps(compiled, state, batch, args.warmup, args.steps)
    stats = jax.devices()[0].memory_stats() or {}
    return {"mixer": mixer, "impl": impl, "seq_len": seq_len, "batch_size": batch_size,
            "params": sum(int(x.size) for x in jax.tree.leaves(params)),
            "step_seconds": step_time, "tokens_per_second": batch_size * seq_len / step_time,
            "model_tflops_per_second": 3 * flops_per_token(config, seq_len) * batch_size * seq_len / step_time / 1e12,
            "compiled_bytes": _memory(compiled), "device_peak_bytes": stats.get("peak_bytes_in_use"),
            "loss": float(metrics["loss"]), "device": jax.devices()[0].device_kind}


def run_isolated(args, mixer: str, impl: str, seq_len: int) -> dict:
    """``run_case`` in a fresh process, so the device's peak memory is this case's."""
    command = [sys.executable, __file__, "--case", f"{mixer}:{impl}:{seq_len}", *sys.argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(results: list[dict]) -> list[dict]:
    """``pallas / xla`` and ``pallas / Transformer++`` tokens/s per recurrent mixer and T."""
    speed = {(r["mixer"], r["impl"], r["seq_len"]): r["tokens_per_second"] for r in results if "error" not in r}
    rows = []
    for (mixer, impl, seq_len), tokens in speed.items():
        if impl != "pallas":
            continue
        xla, baseline = speed.get((mixer, "xla", seq_len)), speed.get(("attention", "n/a", seq_len))
        rows.append({"mixer": mixer, "seq_len": seq_len,
                     "pallas_over_xla": tokens / xla if xla else None,
                     "pallas_over_transformer": tokens / baseline if baseline else None})
    return rows


def cases(args):
    for seq_len in (int(t) for t in args.seq_lens.split(",")):
        for mixer in filter(None, args.mixers.split(",")):
            impls = ["n/a"] if mixer in ("attention", "swa") else args.impls.split(",")
            for impl in impls:
                yield mixer, impl, seq_len


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixers", default=DEFAULT_MIXERS)
    parser.add_argument("--seq-lens", default=None, help="comma-separated T (default 4096,16384; --small: 64)")
    parser.add_argument("--impls", default="pallas,xla")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="default 32768 (--small: 128)")
    parser.add_argument("--layers", type=int, default=0, help="0 = 12 (--small: 2)")
    parser.add_argument("--remat", default="none", help="model.remat of every case")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10, --small 2)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="tiny model and shapes: a CPU smoke run")
    parser.add_argument("--isolate", action="store_true", help="run every case in its own process")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # mixer:impl:T, used by --isolate
    parser.add_argument("--out", default=str(RESULTS / "train_step.json"))
    args = parser.parse_args(argv)
    args.seq_lens = args.seq_lens or ("64" if args.small else "4096,16384")
    args.tokens_per_step = args.tokens_per_step or (128 if args.small else 32768)
    args.steps = args.steps or (2 if args.small else 10)
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    if args.case:
        mixer, impl, seq_len = args.case.split(":")
        print(json.dumps(run_case(args, mixer, impl, int(seq_len))))
        return 0
    results = []
    for mixer, impl, seq_len in cases(args):
        try:
            result = (run_isolated if args.isolate else run_case)(args, mixer, impl, seq_len)
        except Exception as error:  # an OOM or a lowering failure is a result too
            result = {"mixer": mixer, "impl": impl, "seq_len": seq_len, "error": f"{type(error).__name__}: {error}"}
        results.append(result)
        print(json.dumps(result), flush=True)
    report = {"args": vars(args), "platform": platform.platform(), "results": results, "ratios": ratios(results)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
