"""The distillation curve of an AHN run: KL(teacher || student) beyond the window per step, from its metrics.

    python experiments/ahn/curve.py --run runs/ahn_paper/gated_deltanet --out experiments/ahn/results/paper

Reads ``<run>/metrics.jsonl`` (one record per logged step, as ``train.py`` writes it: ``loss`` is the mean KL
over the step's positions beyond its window, ``loss_tokens`` their count) and writes under ``--out``:
``curve.json`` (every step's KL, tokens and step time, and the token-weighted mean KL of consecutive blocks
of ``--block`` steps) and ``curve.png`` (each step's KL and the blocks' means against the step). Each step
is a different row, and with ``model.ahn.random_window`` a different window, so single steps are noisy:
read the block means. Existing outputs are refused, never overwritten.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUTPUTS = ("curve.json", "curve.png")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory written by train.py")
    parser.add_argument("--block", type=int, default=10, help="steps per block mean")
    parser.add_argument("--out", required=True, help="directory for curve.json and curve.png")
    args = parser.parse_args(argv)
    if args.block < 1:
        parser.error(f"--block must be >= 1, got {args.block}")
    return args


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


def plot(steps: list[dict], blocks: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot([s["step"] for s in steps], [s["loss"] for s in steps], ".", alpha=0.5, label="one step (one row)")
    axis.hlines([b["kl"] for b in blocks], [b["first_step"] - 0.5 for b in blocks],
                [b["last_step"] + 0.5 for b in blocks], colors="C1", linewidth=2, label="block mean (token-weighted)")
    axis.set_xlabel("step")
    axis.set_ylabel("KL beyond the window (nats / token)")
    axis.set_yscale("log")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    existing = [str(out / name) for name in OUTPUTS if (out / name).exists()]
    if existing:
        raise SystemExit(f"{', '.join(existing)} already exist: choose another --out (nothing was written)")
    steps = read_steps(Path(args.run))
    blocks = block_means(steps, args.block)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps({"run": Path(args.run).name, "block": args.block, "steps": steps,
                                                "blocks": blocks}, indent=1) + "\n")
    plot(steps, blocks, out / "curve.png")
    for entry in blocks:
        print(f"steps {entry['first_step']}-{entry['last_step']}: KL {entry['kl']:.4f} over {entry['tokens']:.0f} "
              "tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
