"""Regenerate the README tables that quote committed results files, from those files.

A README table generated here sits between two marker lines naming it and its source:

    <!-- table NAME: scripts/readme_tables.py from FILE -->
    | ... |
    <!-- /table NAME -->

``python scripts/readme_tables.py`` rewrites every such block from its file; ``--check`` changes
nothing and exits 1 naming each block that differs from what its file gives (the test suite runs it).
Each table's generator below says which fields of the file each column is.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def _layers(overrides: list[str]) -> int | None:
    for override in overrides:
        match = re.fullmatch(r"model\.mixers=\[\w+\] \* (\d+)", override)
        if match:
            return int(match.group(1))
    return None


# What a variant's name does not say (descriptions, not numbers).
MEMORY_DESCRIPTIONS = {"transformer": "Transformer++", "swa_sinks": "window 128, 4 sinks"}


def memory_sweep() -> str:
    """results/sweeps/memory/results.json: per variant its parameters, forward FLOPs per token, the
    summary's tokens/s (``≥`` where the rate includes compilation), each seed's last evaluated loss (or
    the time-limited run's partial loss) and the summary's mean ± std."""
    results = json.loads((ROOT / "results/sweeps/memory/results.json").read_text())
    common_layers = _layers(results["variants"][0]["overrides"])
    lines = ["| variant | params | fwd FLOPs/token | tokens/s (mixed loads) | val loss, seed 0 / seed 1 | mean ± std |",
             "|---|---|---|---|---|---|"]
    for variant in results["variants"]:
        summary, notes = variant["summary"], []
        if variant["name"] in MEMORY_DESCRIPTIONS:
            notes.append(MEMORY_DESCRIPTIONS[variant["name"]])
        layers = _layers(variant["overrides"])
        if layers is not None and layers != common_layers:
            notes.append(f"{layers} layers")
        if variant["seeds"] != results["seeds"]:
            notes.append(f"{len(variant['seeds'])} seed" + "s" * (len(variant["seeds"]) != 1))
        if variant["time_limit_minutes"] != results["time_limit_minutes"]:
            notes.append(f"{variant['time_limit_minutes']:g} min")
        name = variant["name"] + (f" ({', '.join(notes)})" if notes else "")
        speed = summary["tokens_per_second"]
        speed_text = ("≥" if summary["speed_includes_compilation"] else "") + f"{speed:,.0f}"
        if summary["loss_mean"] is not None:
            seeds = [run["eval"]["curve"][-1]["loss"] for run in variant["runs"]]
            loss_text = " / ".join(f"{loss:.3f}" for loss in seeds)
            mean_text = f"{summary['loss_mean']:.3f} ± {summary['loss_std']:.3f}"
        elif summary["partial_losses"]:
            loss_text = "(" + ", ".join(f"{loss:.3f} at {_si(tokens)} tokens" for tokens, loss in
                                        summary["partial_losses"]) + ")"
            mean_text = ""
        else:
            loss_text, mean_text = "not evaluated within the limit", ""
        lines.append(f"| {name} | {_si(variant['parameters'])} | {_si(variant['forward_flops_per_token'])} | "
                     f"{speed_text} | {loss_text} | {mean_text} |")
    return "\n".join(lines)


AHN_COMPRESSORS = {"gated_deltanet": "AHN GDN", "deltanet": "AHN DeltaNet", "mamba2": "AHN Mamba2"}


def ahn_loss() -> str:
    """experiments/ahn/results/ahn.json: per length the loss of full attention (the teacher), of the
    sliding window and of each compressor, and the share of the window's gap to full attention that
    the compressor recovers, (window - AHN) / (window - full)."""
    results = json.loads((ROOT / "experiments/ahn/results/ahn.json").read_text())["results"]
    window = results[next(iter(results))]["eval"]["window"]
    header = ["T", "scored tokens", "full attention", "sliding window + sinks", *AHN_COMPRESSORS.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    reference = results[next(iter(AHN_COMPRESSORS))]["eval"]["loss"]
    for index, row in enumerate(reference):
        cells = [f"{row['length']} ({row['length'] // window} x W)", str(row["tokens"]), f"{row['teacher']:.4f}",
                 f"{row['swa']:.4f}"]
        for name in AHN_COMPRESSORS:
            other = results[name]["eval"]["loss"][index]
            assert other["length"] == row["length"] and other["teacher"] == row["teacher"], (name, other["length"])
            share = (other["swa"] - other["ahn"]) / (other["swa"] - other["teacher"])
            cells.append(f"{other['ahn']:.4f} ({100 * share:.1f}% of the gap)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


TABLES = {
    "memory-sweep": ("results/sweeps/memory/README.md", "results/sweeps/memory/results.json", memory_sweep),
    "ahn-loss": ("experiments/ahn/README.md", "experiments/ahn/results/ahn.json", ahn_loss),
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- table {re.escape(name)}: [^\n]*-->\n)(.*?)(\n<!-- /table {re.escape(name)} -->)",
                      re.DOTALL)


def committed_table(name: str) -> str:
    """The table ``name`` as its README holds it (between its markers)."""
    readme, _, _ = TABLES[name]
    match = _block(name).search((ROOT / readme).read_text())
    if match is None:
        raise ValueError(f"{readme} has no block '<!-- table {name}: ... -->' ... '<!-- /table {name} -->'")
    return match.group(2)


def marked_tables(text: str) -> list[str]:
    """The names of the table blocks a README text opens."""
    return re.findall(r"<!-- table ([\w-]+): ", text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    parser.add_argument("names", nargs="*", help=f"tables to regenerate (default all: {', '.join(TABLES)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(TABLES))
    if unknown:
        parser.error(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(TABLES)}")
    stale = []
    for name in args.names or list(TABLES):
        readme, source, generate = TABLES[name]
        table = generate()
        if committed_table(name) == table:
            continue
        stale.append(f"{name} in {readme} (from {source})")
        if not args.check:
            path = ROOT / readme
            path.write_text(_block(name).sub(lambda m: m.group(1) + table + m.group(3), path.read_text(), count=1))
    if stale:
        print(("out of date: " if args.check else "rewrote: ") + "; ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
