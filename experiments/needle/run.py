"""Needle in a haystack: train models at one length, score greedy retrieval at 1x, 2x and 4x that length.

    python experiments/needle/run.py                  # Atlas, Titans, Transformer++ on CPU (~30 min)
    python experiments/needle/run.py --models atlas,transformer --steps 50 --per-depth 2 --out scratch/needle

Each model is its config (``configs/<name>.yaml``: atlas, titans, omeganet, transformer, swa,
atlas_mag, atlas_mal, or ``ablations/<name>``) shrunk to ``--layers`` layers of ``--d-model``,
trained by ``train.py``'s loop on ``data.source=needle`` rows of ``--seq-len + 1`` tokens (one
needle at a uniform depth, loss on the answer only), then evaluated on fresh examples of
L = ``seq-len + 1``, 2L and 4L tokens with the needle at each of ``--depths``: an example counts
when the greedy continuation of the query equals the value (``seqmodels.evaluation.needle``).
Writes ``needle.json`` (settings, per-model training summary, accuracy by length and depth) and
``needle.md`` (the tables) under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

from seqmodels.config_io import load_config
from seqmodels.data.sources.needle import needle_eval_examples
from seqmodels.runs.load import load_run
from seqmodels.evaluation.needle import needle_accuracy
from seqmodels.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"

LENGTH_FACTORS = (1, 2, 4)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="atlas,titans,transformer", help="comma-separated config names")
    parser.add_argument("--seq-len", type=int, default=128, help="training row length (tokens - 1)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--key-length", type=int, default=2, help="digits of the needle's key")
    parser.add_argument("--value-length", type=int, default=2, help="digits of the needle's value (the answer)")
    parser.add_argument("--override", action="append", default=[],
                        help="extra config override for every model, e.g. model.atlas.memory_expansion=1")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths evaluated")
    parser.add_argument("--per-depth", type=int, default=20, help="evaluation examples per depth and length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: rewrite needle.md from the needle.json already in --out")
    parser.add_argument("--merge", action="store_true",
                        help="add the trained models to the needle.json already in --out (same settings required) "
                             "instead of replacing it")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "needle"), help="run directories")
    return parser.parse_args(argv)


def model_overrides(name: str, args) -> list[str]:
    """Overrides that shrink the config ``name`` to the experiment's model and needle data."""
    config = load_config(ROOT / "configs" / f"{name}.yaml")
    layer_kind = config.model.mixers[0]
    return [
        f"model.mixers=[{layer_kind}] * {args.layers}", f"model.d_model={args.d_model}",
        f"model.num_heads={args.heads}", f"model.max_seq_len={LENGTH_FACTORS[-1] * (args.seq_len + 1)}",
        "model.kernel_impl=xla",
        "data.source=needle", f"data.seq_len={args.seq_len}", f"data.seed={args.seed}",
        f"data.needle_key_length={args.key_length}", f"data.needle_value_length={args.value_length}",
        f"train.steps={args.steps}", f"train.batch_size={args.batch_size}", f"train.seed={args.seed}",
        f"train.run_dir={Path(args.work_dir) / name.replace('/', '_')}", f"optim.learning_rate={args.learning_rate}",
        f"optim.warmup_steps={max(1, args.steps // 20)}", "checkpoint.resume=false",
        f"checkpoint.every_steps={args.steps}", "checkpoint.async_save=false", "log.progress=never",
        f"log.every_steps={max(1, args.steps // 10)}", "log.tensorboard=false", *args.override,
    ]


def run_model(name: str, args, depths) -> dict:
    config = load_config(ROOT / "configs" / f"{name}.yaml", model_overrides(name, args))
    shutil.rmtree(config.train.run_dir, ignore_errors=True)
    start = time.perf_counter()
    summary = train(config)
    train_seconds = time.perf_counter() - start
    _, model, _ = load_run(config.train.run_dir)
    data = config.data
    atlas = dataclasses.asdict(config.model.atlas) if config.model.mixers[0].startswith("atlas") else None
    results = {"mixers": list(config.model.mixers), "atlas": atlas, "train_seconds": round(train_seconds, 1),
               "first_loss": summary["first_loss"], "last_loss": summary["last_loss"], "by_length": {}}
    start = time.perf_counter()
    for factor in LENGTH_FACTORS:
        length = factor * (data.seq_len + 1)
        examples = needle_eval_examples(length, depths, args.per_depth, seed=args.seed + 1,
                                        key_length=data.needle_key_length, value_length=data.needle_value_length,
                                        distractors=data.needle_distractors)
        results["by_length"][f"{factor}x"] = {"tokens": length, **needle_accuracy(model, examples)}
    results["eval_seconds"] = round(time.perf_counter() - start, 1)
    return results


def markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [f"Needle in a haystack: trained on rows of {settings['seq_len'] + 1} tokens for {settings['steps']} "
             f"steps (batch {settings['batch_size']}, d_model {settings['d_model']}, {settings['layers']} layers); "
             f"greedy retrieval of a {settings['value_length']}-digit value, {settings['per_depth']} examples "
             f"per depth and length.", "",
             "| model | " + " | ".join(f"{f}x ({report['lengths'][f'{f}x']} tokens)" for f in LENGTH_FACTORS)
             + " | final train loss | train s |",
             "|---|" + "---|" * (len(LENGTH_FACTORS) + 2)]
    for name, result in report["models"].items():
        accuracies = " | ".join(f"{result['by_length'][f'{f}x']['accuracy']:.2f}" for f in LENGTH_FACTORS)
        lines.append(f"| {name} | {accuracies} | {result['last_loss']:.3f} | {result['train_seconds']:.0f} |")
    lines += ["", "Accuracy by needle depth (fraction of the haystack before the needle):", ""]
    depths = list(next(iter(report["models"].values()))["by_length"]["1x"]["by_depth"])
    lines += ["| model | length | " + " | ".join(str(d) for d in depths) + " |", "|---|---|" + "---|" * len(depths)]
    for name, result in report["models"].items():
        for factor in LENGTH_FACTORS:
            by_depth = result["by_length"][f"{factor}x"]["by_depth"]
            lines.append(f"| {name} | {factor}x | " + " | ".join(f"{by_depth[d]:.2f}" for d in depths) + " |")
    return "\n".join(lines) + "\n"


def merged_report(report: dict, previous: dict) -> dict:
    """``report`` with the models of ``previous`` that it does not retrain, when both share settings.

    Raises ``ValueError`` naming the first setting that differs: rows trained differently do not
    belong in one table.
    """
    for key in sorted(set(report["settings"]) | set(previous["settings"])):
        ours, theirs = report["settings"].get(key), previous["settings"].get(key)
        if ours != theirs:
            raise ValueError(f"--merge: setting {key!r} is {ours!r} here but {theirs!r} in the existing needle.json")
    kept = {name: result for name, result in previous["models"].items() if name not in report["models"]}
    # Through JSON, as needle.json stores it: depth keys become strings in every row alike.
    return json.loads(json.dumps({**report, "models": {**kept, **report["models"]}}, default=str))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    if args.report_only:
        report = json.loads((Path(args.out) / "needle.json").read_text())
        (Path(args.out) / "needle.md").write_text(markdown(report))
        print(markdown(report))
        return 0
    depths = [float(d) for d in args.depths.split(",")]
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    data = load_config(None, ["data.source=needle", f"data.seq_len={args.seq_len}",
                              f"data.needle_key_length={args.key_length}",
                              f"data.needle_value_length={args.value_length}"]).data
    report = {"settings": {"overrides": args.override, "seq_len": args.seq_len, "steps": args.steps,
                           "batch_size": args.batch_size,
                           "learning_rate": args.learning_rate, "d_model": args.d_model, "heads": args.heads,
                           "layers": args.layers, "depths": depths, "per_depth": args.per_depth, "seed": args.seed,
                           "key_length": data.needle_key_length, "value_length": data.needle_value_length,
                           "distractors": data.needle_distractors},
              "lengths": {f"{f}x": f * (args.seq_len + 1) for f in LENGTH_FACTORS}, "models": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / "needle.json").read_text()) if args.merge else None
    if previous is not None:
        merged_report(report, previous)  # fail on differing settings before training anything
    for name in names:
        report["models"][name] = run_model(name, args, depths)
        if previous is not None:
            report = merged_report(report, previous)
        (out / "needle.json").write_text(json.dumps(report, indent=2, default=str))
        (out / "needle.md").write_text(markdown(report))
        accuracies = report["models"][name]["by_length"].items()
        print(f"{name}: " + ", ".join(f"{k} {v['accuracy']:.2f}" for k, v in accuracies), flush=True)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
