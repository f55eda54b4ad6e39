"""Training speed of every variant of a sweep file, measured one after another under the same conditions.

    python benchmarks/sweep_speed.py --sweep configs/sweeps/memory.yaml --steps 6 --out results/sweeps/memory/speed.md

A sweep's own tokens/s (``ablate.py``'s table) comes from runs that shared the machine with each other
and with whatever else ran, so their ratios carry the load of the moment. Here each variant trains
``--steps`` steps of its sweep run (same config, same overrides, ``train.seed=0``) in a fresh
single-threaded process, one variant at a time; the first logged step (compilation) is left out and
tokens/s is the median of the rest. A variant still running after ``--time-limit`` seconds is stopped
and measured on the steps it logged (none after the first: no number). Writes a markdown table with
the speed of each variant relative to the first one, and the load average before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, help="sweep YAML, e.g. configs/sweeps/memory.yaml")
    parser.add_argument("--steps", type=int, default=6, help="training steps per variant (>= 3)")
    parser.add_argument("--only", action="append", default=[], metavar="VARIANT", help="measure only this variant")
    parser.add_argument("--time-limit", type=float, default=240.0, help="seconds per variant")
    parser.add_argument("--out", required=True, help="markdown file to write")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps must be >= 3 (the first step compiles and is left out), got {args.steps}")
    if args.time_limit <= 0:
        parser.error(f"--time-limit must be > 0, got {args.time_limit}")
    return args


def speed_of(metrics_path: Path) -> tuple[float | None, int]:
    """(median tokens/s over the logged steps after the first, number of steps logged)."""
    if not metrics_path.is_file():
        return None, 0
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "tokens_per_second" in r]
    later = [r["tokens_per_second"] for r in rows if r["step"] > 1]
    return (statistics.median(later) if later else None), len(rows)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.sweeps.runner import _tail, run_process, run_specs
    from seqmodels.sweeps.spec import SweepError, load_sweep

    try:
        sweep = load_sweep(args.sweep)
        names = [sweep.variant(n).name for n in args.only] or [v.name for v in sweep.variants]
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep_speed_") as scratch:
        specs = {s.variant.name: s for s in run_specs(sweep, Path(scratch)) if s.seed == min(
            s.variant.seeds or sweep.seeds)}
        for name in names:
            spec = specs[name]
            replaced = ("train.steps=", "checkpoint.", "log.every_steps=")
            command = [part for part in spec.train_command if not part.startswith(replaced)]
            command += [f"train.steps={args.steps}", "log.every_steps=1", "checkpoint.every_steps=1000000"]
            spec.run_dir.mkdir(parents=True, exist_ok=True)
            load_before = os.getloadavg()[0]
            code, limited = run_process(command, spec.run_dir / "train.log", args.time_limit)
            speed, logged = speed_of(spec.run_dir / "metrics.jsonl")
            if code not in (0, 3):  # 3: stopped by the limit after saving its step
                print(f"{name}: train.py exited {code}: {_tail(spec.run_dir / 'train.log')}", file=sys.stderr)
            rows.append({"variant": name, "tokens_per_second": speed, "steps_logged": logged, "limited": limited,
                         "exit": code, "load": (load_before, os.getloadavg()[0])})
            print(f"{name:24s} {speed or 0:8.0f} tokens/s  ({logged} steps logged{', stopped' if limited else ''}; "
                  f"load {load_before:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(markdown(rows, args, sweep))
    print(f"wrote {args.out}")
    return 0 if all(r["tokens_per_second"] for r in rows) else 1


def markdown(rows, args, sweep) -> str:
    baseline = rows[0]["tokens_per_second"] if rows and rows[0]["tokens_per_second"] else None
    lines = [f"# Training speed of the variants of `{sweep.name}`, one at a time",
             "",
             f"`python benchmarks/sweep_speed.py --sweep {args.sweep} --steps {args.steps}"
             f" --time-limit {args.time_limit:g} --out {args.out}`",
             "",
             f"Each variant: {args.steps} steps of its sweep run in a fresh single-threaded process, one variant "
             "at a time; median tokens/s of the logged steps after the first (compiling) one.",
             "",
             f"| variant | tokens/s | × {rows[0]['variant'] if rows else 'first'} | steps logged | load average "
             "before → after |",
             "|---|---:|---:|---:|---|"]
    for row in rows:
        speed = row["tokens_per_second"]
        ratio = f"{speed / baseline:.2f}" if speed and baseline else "–"
        text = f"{speed:.0f}" if speed else "– (no step after the first within the limit)"
        lines.append(f"| {row['variant']} | {text} | {ratio} | {row['steps_logged']} | "
                     f"{row['load'][0]:.1f} → {row['load'][1]:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
