"""The distillation curve of AHN runs: KL(teacher || student) beyond the window per step, from their metrics.

    python experiments/ahn/curve.py --run runs/ahn_paper/gated_deltanet --out experiments/ahn/results/paper
    python experiments/ahn/curve.py --run runs/ahn_paper/gated_deltanet --run runs/ahn_paper/deltanet \
        --run runs/ahn_paper/mamba2 --out experiments/ahn/results/paper/compressors

Reads ``<run>/metrics.jsonl`` (one record per logged step, as ``train.py`` writes it: ``loss`` is the mean KL
over the step's positions beyond its window, ``loss_tokens`` their count) and writes under ``--out``:
``curve.json`` (every step's KL, tokens and step time, and the token-weighted mean KL of consecutive blocks
of ``--block`` steps) and ``curve.png`` (each step's KL and the blocks' means against the step). Each step
is a different row, and with ``model.ahn.random_window`` a different window, so single steps are noisy:
read the block means.

With several ``--run`` (compressors distilled with the same data seed and AHN settings, so step ``s`` of every
run is the same row under the same window) ``curve.json`` holds each run's steps and blocks under ``runs``, and
``paired`` compares each later run with the first on the steps they share from ``--paired-from`` on: the ratio
of their token-weighted mean KLs, ``sum_s KL_run(s) n(s) / sum_s KL_first(s) n(s)``, with a 95 % percentile-
bootstrap interval over steps (``seqmodels.evaluation.intervals.ratio_interval``). Pairing by row removes the
row-to-row spread that dominates a single curve; an interval that excludes 1 separates the two compressors at
this budget. Runs whose shared steps scored different token counts did not see the same rows and windows and are
refused.
Existing outputs are refused, never overwritten.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUTPUTS = ("curve.json", "curve.png")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, action="append",
                        help="run directory written by train.py; repeat to compare runs step by step")
    parser.add_argument("--block", type=int, default=10, help="steps per block mean")
    parser.add_argument("--paired-from", type=int, default=1, metavar="STEP",
                        help="several runs: compare them on the shared steps from this one on (the first steps, "
                             "before any compressor has learned, are alike in every run)")
    parser.add_argument("--out", required=True, help="directory for curve.json and curve.png")
    args = parser.parse_args(argv)
    if args.block < 1:
        parser.error(f"--block must be >= 1, got {args.block}")
    if args.paired_from < 1:
        parser.error(f"--paired-from must be >= 1, got {args.paired_from}")
    names = [run_name(run) for run in args.run]
    if len(set(names)) != len(names):
        parser.error(f"--run directories must have different names (they label the runs), got {names}")
    return args


def run_name(run: str) -> str:
    return Path(run).resolve().name


def read_steps(run: Path) -> list[dict]:
    """The logged steps of ``run`` (the last record of a step, if a resume logged it twice), in step order."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: --run must name a directory train.py has logged to")
    steps = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        record = json.loads(line)
        if "loss" in record and "loss_tokens" in record:
            steps[record["step"]] = {key: record[key] for key in ("step", "loss", "loss_tokens", "step_time")
                                     if key in record}
    if not steps:
        raise SystemExit(f"{path} has no training step with loss and loss_tokens")
    return [steps[step] for step in sorted(steps)]


def block_means(steps: list[dict], block: int) -> list[dict]:
    """Token-weighted mean KL over consecutive blocks of ``block`` steps (the last may be shorter)."""
    blocks = []
    for start in range(0, len(steps), block):
        part = steps[start:start + block]
        tokens = sum(step["loss_tokens"] for step in part)
        blocks.append({"first_step": part[0]["step"], "last_step": part[-1]["step"], "tokens": tokens,
                       "kl": sum(step["loss"] * step["loss_tokens"] for step in part) / tokens})
    return blocks


def paired(reference: tuple[str, list[dict]], other: tuple[str, list[dict]], first_step: int = 1) -> dict:
    """``other``'s token-weighted mean KL over ``reference``'s on the steps ``>= first_step`` both logged, with its
    interval."""
    from seqmodels.evaluation.intervals import ratio_interval
    (reference_name, reference_steps), (name, steps) = reference, other
    by_step = {step["step"]: step for step in reference_steps}
    shared = [(by_step[step["step"]], step) for step in steps if step["step"] in by_step and step["step"] >= first_step]
    if not shared:
        raise SystemExit(f"runs {reference_name} and {name} share no logged step from step {first_step} on: nothing "
                         "to compare")
    for first, second in shared:
        if first["loss_tokens"] != second["loss_tokens"]:
            raise SystemExit(
                f"runs {reference_name} and {name} scored {first['loss_tokens']:.0f} and {second['loss_tokens']:.0f} "
                f"tokens at step {first['step']}: they did not see the same rows and windows, so their steps cannot "
                "be paired (train them with the same data.seed, data.seq_len and model.ahn settings)")
    tokens = [first["loss_tokens"] for first, _ in shared]
    numerators = [second["loss"] * n for (_, second), n in zip(shared, tokens)]
    denominators = [first["loss"] * n for (first, _), n in zip(shared, tokens)]
    return {"run": name, "against": reference_name, "steps": len(shared),
            "first_step": shared[0][0]["step"], "last_step": shared[-1][0]["step"],
            "kl": sum(numerators) / sum(tokens), "reference_kl": sum(denominators) / sum(tokens),
            "ratio": sum(numerators) / sum(denominators), "interval": ratio_interval(numerators, denominators)}


def plot(runs: dict[str, tuple[list[dict], list[dict]]], comparisons: list[dict], path: Path) -> None:
    """Each run's KL per step and block means; with several runs a second panel: each later run's KL over the
    first's on the same row, per step, and the paired ratio of ``comparisons`` over its steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    several = len(runs) > 1
    figure, axes = plt.subplots(2 if several else 1, 1, figsize=(7, 7 if several else 4), squeeze=False,
                                sharex=True)
    axis = axes[0][0]
    for index, (name, (steps, blocks)) in enumerate(runs.items()):
        color = f"C{index}" if several else "C0"
        label = f"{name}: " if several else ""
        axis.plot([s["step"] for s in steps], [s["loss"] for s in steps], ".", color=color, alpha=0.4,
                  label=f"{label}one step (one row)")
        axis.hlines([b["kl"] for b in blocks], [b["first_step"] - 0.5 for b in blocks],
                    [b["last_step"] + 0.5 for b in blocks], colors=color if several else "C1", linewidth=2,
                    label=f"{label}block mean (token-weighted)")
    axis.set_ylabel("KL beyond the window (nats / token)")
    axis.set_yscale("log")
    axis.legend(fontsize=7)
    if several:
        ratio_axis = axes[1][0]
        names = list(runs)
        reference = {step["step"]: step["loss"] for step in runs[names[0]][0]}
        for index, entry in enumerate(comparisons, 1):
            steps = [s for s in runs[entry["run"]][0] if s["step"] in reference and reference[s["step"]] > 0]
            ratio_axis.plot([s["step"] for s in steps], [s["loss"] / reference[s["step"]] for s in steps], ".-",
                            color=f"C{index}", alpha=0.5, linewidth=0.8, label=f"{entry['run']}, one step")
            ratio_axis.hlines(entry["ratio"], entry["first_step"] - 0.5, entry["last_step"] + 0.5,
                              colors=f"C{index}", linestyles="--", linewidth=2,
                              label=f"{entry['run']}, paired ratio {entry['ratio']:.3f} "
                                    f"[{entry['interval']['low']:.3f}, {entry['interval']['high']:.3f}]")
        ratio_axis.axhline(1.0, color="C0", linewidth=1)
        ratio_axis.set_ylabel(f"KL / {names[0]}'s KL on the same row")
        ratio_axis.legend(fontsize=7)
    axes[-1][0].set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    out = Path(args.out)
    existing = [str(out / name) for name in OUTPUTS if (out / name).exists()]
    if existing:
        raise SystemExit(f"{', '.join(existing)} already exist: choose another --out (nothing was written)")
    runs = {}
    for run in args.run:
        steps = read_steps(Path(run))
        runs[run_name(run)] = (steps, block_means(steps, args.block))
    names = list(runs)
    comparisons = [paired((names[0], runs[names[0]][0]), (name, runs[name][0]), args.paired_from)
                   for name in names[1:]]
    if len(runs) == 1:
        steps, blocks = runs[names[0]]
        report = {"run": names[0], "block": args.block, "steps": steps, "blocks": blocks}
    else:
        report = {"block": args.block, "runs": {name: {"steps": steps, "blocks": blocks}
                                                for name, (steps, blocks) in runs.items()}, "paired": comparisons}
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(runs, comparisons, out / "curve.png")
    for name, (_, blocks) in runs.items():
        for entry in blocks:
            print(f"{name} steps {entry['first_step']}-{entry['last_step']}: KL {entry['kl']:.4f} over "
                  f"{entry['tokens']:.0f} tokens")
    for entry in comparisons:
        interval = entry["interval"]
        print(f"{entry['run']} / {entry['against']} over {entry['steps']} shared steps: KL {entry['kl']:.4f} / "
              f"{entry['reference_kl']:.4f} = {entry['ratio']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
