"""AHN experiment: distil each compressor on one frozen base, then compare full attention, sliding window
+ sinks alone and AHN beyond the window.

    nice -n 10 python experiments/ahn/run.py --window 64 --sinks 4 --seq-len 256 --rows 8 --steps 16 \\
        --out experiments/ahn/results

One fixed set of ``--rows`` training rows (stdlib text, the base's tokenizer) is used by every
compressor; the teacher's final hidden states for them are computed once and fed to the train step
(``batch["teacher_hidden"]``), so each step runs only the student forward and backward. Each
compressor trains ``--steps`` steps of one row with the project's train step (only the ``ahn``
subtrees train), then the ``ahn`` suite of ``eval.py`` (``seqmodels.evaluation.ahn``) scores it.
Writes ``ahn.json`` (settings, per-step losses, wall times, every suite result), ``ahn.md`` (the
table) and ``loss_by_position.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seqmodels.config import Config, ModelConfig
from seqmodels.config_ahn import AHNConfig, DEFAULT_AHN_BASE
from seqmodels.data.pipeline import make_train_dataset
from seqmodels.evaluation.ahn import evaluate_ahn, markdown_table
from seqmodels.hf.base import resolve_base, start_params
from seqmodels.mixers.attention import AttentionConfig
from seqmodels.models import build_model
from seqmodels.models.ahn import trainable_path
from seqmodels.optim.build import build_optimizer
from seqmodels.runs.portable import portable
from seqmodels.training.step import make_train_step
from seqmodels.models.trainable import split_params

COMPRESSORS = ("gated_deltanet", "deltanet", "mamba2")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=DEFAULT_AHN_BASE, help="model.ahn.base (converted on first use)")
    parser.add_argument("--compressors", default=",".join(COMPRESSORS))
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256, help="training row length")
    parser.add_argument("--rows", type=int, default=8, help="fixed training rows shared by the compressors")
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps of one row per compressor")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--multiples", default="2,4,8", help="evaluation lengths as multiples of the window")
    parser.add_argument("--eval-rows", type=int, default=2, help="held-out rows per evaluation length")
    parser.add_argument("--needles", type=int, default=8, help="retrieval examples")
    parser.add_argument("--tokenizer", help="data.tokenizer (default: hf:<base>)")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def experiment_config(args, compressor: str) -> Config:
    ahn = AHNConfig(base=args.base, compressor=compressor, window=args.window, sinks=args.sinks)
    tokenizer = args.tokenizer or f"hf:{args.base}"
    config = Config(model=ModelConfig(kind="ahn", ahn=ahn, attention=AttentionConfig()),
                    data=dataclasses.replace(Config().data, tokenizer=tokenizer, seq_len=args.seq_len))
    return resolve_base(config)


def training_rows(config: Config, count: int) -> list[dict]:
    iterator = iter(make_train_dataset(config.data, batch_size=1))
    return [{key: jnp.asarray(value) for key, value in next(iterator).items()
             if key in ("inputs", "targets", "loss_mask")} for _ in range(count)]


def distil(config: Config, rows: list[dict], teacher: list, steps: int, learning_rate: float, log) -> tuple:
    model = build_model(config.model, seed=0)
    graphdef, state = nnx.split(model, nnx.Param)
    params = start_params(config.model, nnx.to_pure_dict(state))
    optim = dataclasses.replace(config.optim, learning_rate=learning_rate, warmup_steps=2, weight_decay=0.0)
    optimizer, schedule = build_optimizer(optim, steps)
    step_fn = jax.jit(make_train_step(graphdef, optimizer, schedule, trainable=trainable_path))
    state = {"step": jnp.int32(0), "params": params,
             "opt_state": optimizer.init(split_params(params, trainable_path)[0])}
    losses, start = [], time.perf_counter()
    for step in range(steps):
        batch = {**rows[step % len(rows)], "teacher_hidden": teacher[step % len(rows)]}
        state, metrics = step_fn(state, batch)
        losses.append(float(metrics["loss"]))
        log(f"  step {step + 1}/{steps}: KL beyond the window {losses[-1]:.4f} ({time.perf_counter() - start:.0f} s)")
    return nnx.merge(graphdef, state["params"]), losses, time.perf_counter() - start


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    longest = {name: max(run["eval"]["loss"], key=lambda row: row["length"]) for name, run in results.items()}
    figure, axis = plt.subplots(figsize=(7, 4))
    first = next(iter(longest.values()))
    centres = [np.mean(b["positions"]) for b in first["by_position"]]
    axis.plot(centres, [b["teacher"] for b in first["by_position"]], "k-", label="full attention (teacher)")
    axis.plot(centres, [b["swa"] for b in first["by_position"]], "k--", label="sliding window + sinks")
    for name, row in longest.items():
        axis.plot(centres, [b["ahn"] for b in row["by_position"]], marker=".", label=f"AHN {name}")
    axis.axvline(first["by_position"][0]["positions"][1] * 2, color="grey", lw=0.5)
    axis.set_xlabel("position in the row")
    axis.set_ylabel("loss (nats / token)")
    axis.set_title(f"held-out loss by position, T = {first['length']}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "run.log", "a")

    def log(message):
        print(message, flush=True)
        log_file.write(message + "\n")
        log_file.flush()

    multiples = tuple(int(m) for m in args.multiples.split(","))
    compressors = [name.strip() for name in args.compressors.split(",") if name.strip()]
    started = time.perf_counter()
    configs = {name: experiment_config(args, name) for name in compressors}
    first = configs[compressors[0]]
    rows = training_rows(first, args.rows)
    teacher_model = build_model(first.model, seed=0)
    graphdef, state = nnx.split(teacher_model, nnx.Param)
    teacher_model = nnx.merge(graphdef, start_params(first.model, nnx.to_pure_dict(state)))
    teacher_hidden = nnx.jit(lambda model, tokens: model.hidden(tokens))
    clock = time.perf_counter()
    teacher = [teacher_hidden(teacher_model, row["inputs"]) for row in rows]
    teacher_seconds = time.perf_counter() - clock
    log(f"teacher hidden states of {args.rows} rows x {args.seq_len} tokens: {teacher_seconds:.0f} s")
    results = {}
    for name in compressors:
        log(f"distilling {name}")
        model, losses, seconds = distil(configs[name], rows, teacher, args.steps, args.learning_rate, log)
        clock = time.perf_counter()
        suite = evaluate_ahn(model, configs[name], multiples=multiples, max_batches=args.eval_rows,
                             retrieval_examples=args.needles)
        results[name] = {"train_losses": losses, "train_seconds": seconds, "eval": suite,
                         "eval_seconds": time.perf_counter() - clock}
        log(markdown_table(suite))
    command = "python experiments/ahn/run.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None
                                                                                  else argv))
    command = portable(command)
    summary = {"command": command, "settings": portable(vars(args)), "teacher_seconds": teacher_seconds,
               "wall_seconds": time.perf_counter() - started, "devices": str(jax.devices()), "results": results}
    (out / "ahn.json").write_text(json.dumps(summary, indent=2) + "\n")
    tables = [f"`{command}` ({summary['wall_seconds'] / 60:.1f} min wall on {jax.devices()[0].platform})", ""]
    for name, run in results.items():
        tables += [f"### {name}", "", f"training: {len(run['train_losses'])} steps, KL beyond the window "
                   f"{run['train_losses'][0]:.4f} -> {run['train_losses'][-1]:.4f}, {run['train_seconds']:.0f} s",
                   "", markdown_table(run["eval"])]
    (out / "ahn.md").write_text("\n".join(tables))
    plot(results, out / "loss_by_position.png")
    log(f"wrote {out / 'ahn.json'}, {out / 'ahn.md'} and {out / 'loss_by_position.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
