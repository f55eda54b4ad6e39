"""RULER over the memory sweep's models: each architecture trained on RULER's own format, scored at 1x-4x its length.

    python -m seqmodels.data.builders.corpora debdocs --out data/debdocs
    python -m seqmodels.data.builders.tokenizer train --input data/debdocs --vocab-size 16384 --out tokenizers/debdocs-16k
    OPENBLAS_NUM_THREADS=1 python experiments/ruler/run.py --jobs 2          # trains, evaluates, reports
    python experiments/ruler/run.py --report-only                            # the report from the runs left
    python experiments/ruler/run.py --sweep configs/sweeps/ruler_task_bpe.yaml --jobs 2   # another sweep file

The runs are ``ablate.py --sweep SWEEP`` (default ``configs/sweeps/ruler.yaml``; the sweep file says what each
variant is and why): every variant trains under ``runs/sweeps/NAME/`` (NAME: the sweep file's ``name``) and its
``ruler`` evaluation (``seqmodels.evaluation.ruler``) is written with the sweep's report under
``experiments/ruler/results/NAME/`` (``results.json``, ``table.md``). Then this script reads that
``results.json`` and writes beside it:

- ``ruler.md``: score per variant, task and length (mean over the variant's seeds; with one seed, the cell's
  95 % bootstrap interval over its examples), the lengths as multiples of the training length;
- ``score_by_length.png``: one panel per task, score against length, a line per variant with its interval (or
  range over seeds) as a band.

``--sweep``, ``--jobs``, ``--only`` and ``--report-only`` pass through to ``ablate.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the delta-rule chunk forms call LAPACK (experiments/recall)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
SWEEP = "configs/sweeps/ruler.yaml"


def variant_scores(variant: dict) -> dict:
    """``{task: {length: {"score", "low", "high", "seeds"}}}`` of a variant's evaluated runs (mean over seeds;
    the interval is the cell's own when one seed was evaluated, else the range of the seeds' scores)."""
    evaluated = [run["eval"]["ruler"] for run in variant["runs"] if "ruler" in run.get("eval", {})]
    scores = {}
    for ruler in evaluated:
        for task, entry in ruler["tasks"].items():
            for length, cell in entry["by_length"].items():
                if "score" in cell:
                    scores.setdefault(task, {}).setdefault(int(length), []).append(cell)
    table = {}
    for task, by_length in scores.items():
        table[task] = {}
        for length, cells in sorted(by_length.items()):
            values = [c["score"] for c in cells]
            low, high = ((cells[0]["interval"]["low"], cells[0]["interval"]["high"]) if len(cells) == 1
                         else (min(values), max(values)))
            table[task][length] = {"score": statistics.fmean(values), "low": low, "high": high, "seeds": len(cells)}
    return table


def train_length(results: dict) -> int:
    """Training rows' tokens (``data.seq_len + 1``), from the overrides the report records (the sweep file sets
    ``data.seq_len`` for every variant; read from the report, so no tokenizer or corpus is needed)."""
    for variant in results["variants"]:
        values = [o.split("=", 1)[1] for o in variant["overrides"] if o.startswith("data.seq_len=")]
        if values:
            return int(values[-1]) + 1
    raise ValueError("the sweep's report records no data.seq_len override: set data.seq_len in the sweep file")


def markdown(results: dict, length: int) -> str:
    rows = [(v["name"], variant_scores(v)) for v in results["variants"]]
    tasks = sorted({task for _, table in rows for task in table})
    lengths = sorted({n for _, table in rows for by_length in table.values() for n in by_length})
    header = ["variant", "seeds", "task"] + [f"{n} ({n / length:g}x)" for n in lengths]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|" + "---|" * len(lengths)]
    for name, table in rows:
        if not table:
            lines.append(f"| {name} | 0 | (no evaluation) |" + " |" * len(lengths))
            continue
        for task in tasks:
            by_length = table.get(task, {})
            cells = ["–" if n not in by_length else
                     f"{by_length[n]['score']:.2f} [{by_length[n]['low']:.2f}, {by_length[n]['high']:.2f}]"
                     for n in lengths]
            seeds = max((cell["seeds"] for cell in by_length.values()), default=0)
            lines.append(f"| {name} | {seeds} | {task} | " + " | ".join(cells) + " |")
    evaluation = results["eval"]["ruler"]
    return ("\n".join(lines) + f"\n\nScore: the fraction of references in the greedy continuation (RULER's "
            f"string_match_all), mean over the variant's evaluated seeds (seeds: how many); [low, high]: with one "
            f"seed the 95 % bootstrap interval over the cell's examples, else the range over seeds. "
            f"{evaluation['per_depth']} examples per depth at depths {evaluation['depths']}, prompt seed "
            f"{evaluation['seed']}; trained on rows of {length} tokens.\n")


def plot(results: dict, length: int, path: Path) -> bool:
    """Write the score-by-length figure; False (and nothing written) when no variant has a ruler evaluation yet."""
    rows = [(v["name"], variant_scores(v)) for v in results["variants"]]
    tasks = sorted({task for _, table in rows for task in table})
    if not tasks:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), squeeze=False, sharey=True)
    styles = [(marker, line) for line in ("-", "--", ":") for marker in "os^vDx"]  # overlapping lines stay visible
    for ax, task in zip(axes[0], tasks):
        for (name, table), (marker, line) in zip(rows, styles * len(rows)):
            by_length = table.get(task, {})
            if by_length:
                cells = list(by_length.values())
                seeds = max(c["seeds"] for c in cells)
                drawn, = ax.plot(list(by_length), [c["score"] for c in cells], marker=marker, linestyle=line,
                                 markerfacecolor="none", label=f"{name} ({seeds} seed{'s' * (seeds > 1)})")
                ax.fill_between(list(by_length), [c["low"] for c in cells], [c["high"] for c in cells],
                                color=drawn.get_color(), alpha=0.1, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.axvline(length, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{task}\nband: one seed's 95 % interval, or the range over seeds", fontsize=9)
        ax.set_xlabel("length (tokens); dotted: training length")
        ax.set_ylim(-0.05, 1.05)
    axes[0][0].set_ylabel("RULER score")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default=SWEEP, help=f"sweep YAML (default {SWEEP}); its name names the results' folder")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (ablate.py --jobs)")
    parser.add_argument("--only", action="append", default=[], metavar="VARIANT", help="ablate.py --only")
    parser.add_argument("--report-only", action="store_true", help="ablate.py --report-only: run nothing")
    args = parser.parse_args(argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    sys.path.insert(0, str(ROOT))
    import ablate
    ablate_args = ["--sweep", args.sweep, "--jobs", str(args.jobs), "--results-dir", str(RESULTS.relative_to(ROOT))]
    ablate_args += [flag for name in args.only for flag in ("--only", name)]
    ablate_args += ["--report-only"] * args.report_only
    status = ablate.main(ablate_args)
    if status == ablate.EXIT_USAGE:
        return status
    from seqmodels.sweeps.spec import load_sweep
    out = RESULTS / load_sweep(args.sweep).name  # ablate.py has read this file already: it loads
    results = json.loads((out / "results.json").read_text())
    length = train_length(results)
    (out / "ruler.md").write_text(markdown(results, length))
    plotted = plot(results, length, out / "score_by_length.png")
    print(f"ruler: wrote {out / 'ruler.md'}" + (f" and {out / 'score_by_length.png'}" if plotted
                                                 else " (no variant evaluated yet: no plot)"))
    return status


if __name__ == "__main__":
    sys.exit(main())
