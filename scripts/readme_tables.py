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


def _table(header: list[str], rows: list[list[str]], right_from: int, right_first: bool = False) -> str:
    """A markdown table, ``| --- |`` rules, the columns from ``right_from`` on (and the first, with
    ``right_first``) right-aligned."""
    rule = ["---:" if index >= right_from or (right_first and index == 0) else "---" for index in range(len(header))]
    return "\n".join(("| " + " | ".join(cells) + " |").replace("|  |", "| |") for cells in [header, rule, *rows])


def _json(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _bold(text: str, bold: bool) -> str:
    return f"**{text}**" if bold else text


CFL = "experiments/cfl/results"
CFL_DEFAULT_BATCH = "32"  # configs/looped_cfl.yaml's train.batch_size, which a command without the override ran
# The runs of each table of experiments/cfl/README.md, in its order (labels are descriptions of the runs).
CFL_RECIPES = ["marked_palindrome_sinusoidal", "marked_palindrome_sinusoidal_4k", "marked_palindrome_rope_curriculum",
               "dyck2_loops2_curriculum", "dyck2_loops2_sinusoidal", "dyck2_loops3_sinusoidal",
               "dyck2_d128_loops2_sinusoidal", "dyck2_batch64_loops2_sinusoidal", "bfvp_loops2_curriculum",
               "bfvp_loops3_sinusoidal"]
CFL_BATCH128 = ["dyck2_batch128_loops2_sinusoidal", "bfvp_batch128_loops2_sinusoidal", "bfvp_batch128_loops2_sinusoidal_5k"]
CFL_BATCH256 = [("bfvp_batch128_loops2_sinusoidal_5k", " (above)"), ("bfvp_batch256_loops2_sinusoidal_4k", ""),
                ("bfvp_batch128_loops2_sinusoidal_8k", "")]
CFL_LENGTHS_TO_12 = ["bfvp_lengths_to_12", "bfvp_lengths_to_12_batch64", "bfvp_lengths_to_12_batch128",
                     "bfvp_lengths_to_12_d128_batch64"]
CFL_HELDOUT = [("dyck1 (`marked_palindrome_dyck1`, 3000 steps)", "dyck1"),
               ("dyck2 (`dyck2_batch128_loops2_sinusoidal`)", "dyck2"),
               ("marked_palindrome (`marked_palindrome_sinusoidal`)", "marked_palindrome"),
               ("bfvp (`bfvp_batch128_loops2_sinusoidal`)", "bfvp"),
               ("bfvp (`bfvp_batch128_loops2_sinusoidal_5k`; `heldout/bfvp_5000_steps.json`)", "bfvp_5000_steps")]
CFL_HELDOUT_BATCH256 = [("batch 128, 5000 steps (above)", "bfvp_5000_steps"),
                        ("batch 256, 4000 steps", "bfvp_batch256_4000_steps"),
                        ("batch 128, 8000 steps", "bfvp_batch128_8000_steps")]
CFL_CONTINUED = [(6000, 1), (6300, 2), (6800, 3)]
CFL_CONTINUED_HELDOUT = [("4000 (even N)", "bfvp_batch256_4000_steps"), ("6000 (even N)", "bfvp_continued_6000_steps"),
                         ("6300 (every N)", "bfvp_continued_6300_steps"), ("6800 (every N)", "bfvp_continued_6800_steps"),
                         ("6800, seed 2026 (every N)", "bfvp_continued_6800_steps_seed2026")]


def _cfl_run(name: str) -> dict:
    return _json(f"{CFL}/long/{name}.json")


def _cfl_accuracy(report: dict, language: str) -> dict[str, float]:
    """The looped + padded model's accuracy per evaluated length (the key ``run.py`` wrote) on ``language``."""
    (result,) = report["variants"].values()
    return {length: cell["accuracy"] for length, cell in result["accuracy"][language].items()}


def _cfl_overrides(command: str) -> dict[str, str]:
    return dict(re.findall(r"([\w.]+)=(\S+)", command))


def _cfl_recipe(command: str, omit: tuple[str, ...] = ()) -> str:
    """The overrides column: what the ``run.py`` command changes from the recipe of its section."""
    overrides, parts = _cfl_overrides(command), []
    if overrides.get("model.d_model", "64") != "64":
        parts += [f"d_model {overrides['model.d_model']}", f"lr {overrides['optim.learning_rate']}"]
    if "train.batch_size" in overrides:
        parts.append(f"batch {overrides['train.batch_size']}")
    if "model.looped.loops_scale" in overrides and "loops" not in omit:
        parts.append(f"loops x{overrides['model.looped.loops_scale']}")
    if overrides.get("model.looped.positions") == "rope+sinusoidal" and "positions" not in omit:
        parts.append("sinusoidal")
    if "data.cfl.curriculum_steps" in overrides:
        parts.append(f"curriculum {overrides['data.cfl.curriculum_steps']}")
    parts.append(f"{overrides['train.steps']} steps")
    return ", ".join(parts)


def _cfl_mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def cfl_grid() -> str:
    """experiments/cfl/results/grid/cfl.json: per variant the mean accuracy over every language at the
    training lengths and beyond them (as ``report.py`` computes it)."""
    report = _json(f"{CFL}/grid/cfl.json")
    longest = report["train_lengths"][1]
    rows = []
    for name, result in report["variants"].items():
        cells = [cell for per_length in result["accuracy"].values() for cell in per_length.values()]
        rows.append([name, f"{_cfl_mean(c['accuracy'] for c in cells if c['length'] <= longest):.3f}",
                     f"{_cfl_mean(c['accuracy'] for c in cells if c['length'] > longest):.3f}"])
    return _table(["variant", f"mean accuracy, N <= {longest}", f"mean accuracy, N > {longest}"], rows, 1)


def _cfl_languages(runs: list[str], languages: list[str]) -> str:
    reports = [_cfl_run(name) for name in runs]
    rows = []
    for language in languages:
        (report,) = [r for r in reports if language in r["languages"]]
        lengths = report["eval_lengths"]
        accuracy = _cfl_accuracy(report, language)
        rows.append([language, *(f"{accuracy[str(n)]:.3f}" for n in lengths)])
    longest = reports[0]["train_lengths"][1]
    header = ["language", *(f"{n}" + "*" * (n > longest) for n in reports[0]["eval_lengths"])]
    return _table(header, rows, 1)


def cfl_long_width64() -> str:
    """experiments/cfl/results/long/{dyck2_bfvp,marked_palindrome_dyck1}.json: accuracy per language and length."""
    return _cfl_languages(["dyck2_bfvp", "marked_palindrome_dyck1"], ["dyck1", "dyck2", "marked_palindrome", "bfvp"])


def cfl_long_width128() -> str:
    """experiments/cfl/results/long/{dyck2,marked_palindrome}_d128.json: accuracy per language and length."""
    return _cfl_languages(["dyck2_d128", "marked_palindrome_d128"], ["dyck2", "marked_palindrome"])


def _cfl_files(runs: list[tuple[str, str]], bold: set[tuple[str, int]], omit=(), language_column=True,
               notes: dict[str, str] | None = None) -> str:
    """One row per ``(file, label)``: the run's language, its overrides, accuracy per length, CPU s."""
    rows, header = [], None
    for name, label in runs:
        report = _cfl_run(name)
        (language,) = report["languages"]
        accuracy = _cfl_accuracy(report, language)
        recipe = _cfl_recipe(report["command"], omit) + (notes or {}).get(name, "")
        cells = [f"`{name}`{label}"] + ([language] if language_column else []) + [recipe]
        cells += [_bold(f"{accuracy[str(n)]:.3f}", (name, n) in bold) for n in report["eval_lengths"]]
        rows.append(cells + [f"{report['cpu_seconds']:.0f}"])
        longest = report["train_lengths"][1]
        header = (["file"] + (["language"] if language_column else []) + ["overrides"]
                  + [f"{n}" + "*" * (n > longest) for n in report["eval_lengths"]] + ["CPU s"])
    return _table(header, rows, 2 + language_column)


def cfl_recipes() -> str:
    """experiments/cfl/results/long/<file>.json, one run each: its overrides (from its command), the
    looped + padded model's accuracy per length and the command's CPU seconds."""
    return _cfl_files([(name, "") for name in CFL_RECIPES], {("marked_palindrome_sinusoidal", 16),
                                                       ("marked_palindrome_sinusoidal", 32)},
                      notes={"marked_palindrome_rope_curriculum": " (RoPE only)"})


def cfl_batch128() -> str:
    """experiments/cfl/results/long/{dyck2,bfvp}_batch128_*.json: as ``cfl_recipes``."""
    return _cfl_files([(name, "") for name in CFL_BATCH128], {("dyck2_batch128_loops2_sinusoidal", 16),
                                                       ("dyck2_batch128_loops2_sinusoidal", 32),
                                                       ("bfvp_batch128_loops2_sinusoidal_5k", 16)})


def cfl_batch256() -> str:
    """experiments/cfl/results/long/bfvp_batch{128,256}_*.json: as ``cfl_recipes``, bfvp only."""
    return _cfl_files(CFL_BATCH256, {("bfvp_batch128_loops2_sinusoidal_5k", 16), ("bfvp_batch256_loops2_sinusoidal_4k", 16)},
                      omit=("loops", "positions"), language_column=False)


def cfl_lengths_to_12() -> str:
    """experiments/cfl/results/long/bfvp_lengths_to_12*.json: width and learning rate, batch (from the
    command), accuracy at N = 8 / 10 / 12 and CPU seconds."""
    rows = []
    for name in CFL_LENGTHS_TO_12:
        report = _cfl_run(name)
        overrides = _cfl_overrides(report["command"])
        accuracy = _cfl_accuracy(report, "bfvp")
        rows.append([f"`{name}`", f"{overrides['model.d_model']}, {overrides['optim.learning_rate']}",
                     overrides.get("train.batch_size", CFL_DEFAULT_BATCH),
                     *(_bold(f"{accuracy[str(n)]:.3f}", "batch" in name and "d128" not in name)
                       for n in report["eval_lengths"]), f"{report['cpu_seconds']:.0f}"])
    return _table(["file", "d_model, lr", "batch", "8", "10", "12", "CPU s"], rows, 2)


def _cfl_heldout(name: str) -> dict[int, float]:
    report = _json(f"{CFL}/long/heldout/{name}.json")
    (per_length,) = report["cfl"].values()
    return {int(length): cell["accuracy"] for length, cell in per_length.items()}


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.3f}" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}-{high:.3f}"


def _mean_text(value: float) -> str:
    # a mean just short of 1 keeps the digit that tells it from 1
    return f"{value:.4f}" if f"{value:.3f}" == "1.000" and value < 1 else f"{value:.3f}"


def _heldout_rows(runs: list[tuple[str, str]], short: int, shown: list[int], bold_mean: set[str]) -> list[list[str]]:
    rows = []
    for label, name in runs:
        accuracy = _cfl_heldout(name)
        values = list(accuracy.values())
        rows.append([label, _span([a for n, a in accuracy.items() if n <= short]),
                     *(f"{accuracy[n]:.3f}" for n in shown),
                     _bold(_mean_text(sum(values) / len(values)), name in bold_mean), f"{min(values):.3f}"])
    return rows


def cfl_heldout() -> str:
    """experiments/cfl/results/long/heldout/<language>.json (512 strings per even N, seed 4321): the range
    of accuracy over N = 2..12, accuracy at N = 16..32, the mean over every scored N and the lowest."""
    shown = [16, 20, 24, 28, 32]
    return _table(["language (run)", "N = 2..12", *map(str, shown), "mean, N = 2..32", "lowest"],
                  _heldout_rows(CFL_HELDOUT, 12, shown, set()), 1)


def cfl_heldout_batch256() -> str:
    """experiments/cfl/results/long/heldout/bfvp_{5000_steps,batch256_4000_steps,batch128_8000_steps}.json:
    as ``cfl_heldout``."""
    shown = [14, 16, 18, 20, 24, 28, 32]
    return _table(["run", "N = 2..12", *map(str, shown), "mean, N = 2..32", "lowest"],
                  _heldout_rows(CFL_HELDOUT_BATCH256, 12, shown, {"bfvp_batch256_4000_steps"}), 1)


def cfl_continued() -> str:
    """experiments/cfl/results/long/bfvp_batch256_loops2_sinusoidal_4k.json (step 4000) and
    bfvp_continued_<step>.json (``eval.py``, seed 1234, 256 strings): accuracy per length at each phase's end."""
    lengths = [16, 24, 32, 48, 64]
    start = _cfl_accuracy(_cfl_run("bfvp_batch256_loops2_sinusoidal_4k"), "bfvp")
    rows = [["4000", "batch 256, end of its run", *(f"{start[str(n)]:.3f}" if str(n) in start else "" for n in lengths)]]
    for step, phase in CFL_CONTINUED:
        report = _cfl_run(f"bfvp_continued_{step}")
        assert report["step"] == step and report["cfl_seed"] == 1234, (step, report["step"], report["cfl_seed"])
        accuracy = {int(n): cell["accuracy"] for n, cell in report["cfl"]["bfvp"].items()}
        rows.append([str(step), f"{phase}, end (`bfvp_continued_{step}.json`)",
                     *(_bold(f"{accuracy[n]:.3f}", step == 6800 and n <= 32) for n in lengths)])
    return _table(["step", "phase", *(f"{n}" + "*" * (n > 32) for n in lengths)], rows, 2, right_first=True)


def cfl_continued_heldout() -> str:
    """experiments/cfl/results/long/heldout/bfvp_{batch256_4000,continued_<step>}_steps*.json: accuracy over
    N <= 10 (its range, or the one N that differs), at chosen N, the lowest (and where) and the mean."""
    shown = [4, 12, 16, 20, 24, 28, 30, 32]
    rows = []
    for label, name in CFL_CONTINUED_HELDOUT:
        accuracy = _cfl_heldout(name)
        short = {n: a for n, a in accuracy.items() if n <= 10}
        others = [n for n, a in short.items() if a != 1.0]
        short_text = f"1.000 but N = {others[0]}" if len(others) == 1 else _span(list(short.values()))
        lowest = min(accuracy.values())
        where = ", ".join(str(n) for n, a in accuracy.items() if f"{a:.3f}" == f"{lowest:.3f}")
        final = name.startswith("bfvp_continued_6800")
        rows.append([label, short_text, *(_bold(f"{accuracy[n]:.3f}", accuracy[n] < 0.6) for n in shown),
                     _bold(f"{lowest:.3f}", final) + f" (N = {where})",
                     _bold(f"{sum(accuracy.values()) / len(accuracy):.3f}", final)])
    return _table(["step", "N = 1..10", *map(str, shown), "lowest, N <= 32", "mean"], rows, 2, right_first=True)


NEEDLE = "experiments/needle/results"
# The rows of each table of experiments/needle/README.md: (label, results file under NEEDLE, model).
NEEDLE_ETA_SWEEP = [("[0, 0.05]", "eta_sweep/eta_0.05/needle.json", "atlas"),
                    ("[0, 0.1]", "eta_sweep/eta_0.1/needle.json", "atlas"),
                    ("[0, 0.2]", "eta_sweep/eta_0.2/needle.json", "atlas"),
                    ("eta on the gradient, [0, 0.05] (table below)", "needle.json", "atlas")]
NEEDLE_CORRECTED = [("atlas (corrected defaults)", "corrected/needle.json", "atlas")]
NEEDLE_ABLATIONS = [("atlas (the row above)", "corrected/needle.json", "atlas"),
                    ("omeganet: `ns_steps` 5 -> 0", "corrected/needle.json", "omeganet"),
                    ("`ablations/atlas_degree1`: `poly_degree` 2 -> 1", "corrected/needle.json", "ablations/atlas_degree1"),
                    ("`ablations/atlas_window1`: `window` 8 -> 1", "corrected/needle.json", "ablations/atlas_window1"),
                    ("`ablations/atlas_linear`: `memory_depth` 2 -> 1", "corrected/needle.json", "ablations/atlas_linear"),
                    ("titans (window 1, degree 1, no NS, eta [0, 0.5])", "corrected/needle.json", "titans")]
NEEDLE_ETA_CURRENT = [("[0, 0.02]", "eta_sweep_current/eta_0.02/needle.json", "atlas"),
                      ("[0, 0.05] (`corrected/`, the default, commit 69af667)", "corrected/needle.json", "atlas"),
                      ("[0, 0.05] (`eta_0.05`, commit cbd0c80)", "eta_sweep_current/eta_0.05/needle.json", "atlas"),
                      ("[0, 0.1]", "eta_sweep_current/eta_0.1/needle.json", "atlas"),
                      ("[0, 0.2]", "eta_sweep_current/eta_0.2/needle.json", "atlas")]
NEEDLE_BEFORE = [(model, "needle.json", model) for model in ("transformer", "titans", "atlas", "omeganet")]


def _needle(first: str, rows: list[tuple[str, str, str]]) -> str:
    """Per row the model's retrieval accuracy at each evaluated length, its last training loss and its
    training seconds, as ``needle.json`` records them."""
    lines, lengths = [], None
    for label, path, model in rows:
        report = _json(f"{NEEDLE}/{path}")
        if lengths is None:
            lengths = report["lengths"]
        assert report["lengths"] == lengths, (path, report["lengths"], lengths)
        result = report["models"][model]
        lines.append([label, *(f"{result['by_length'][name]['accuracy']:.2f}" for name in lengths),
                      f"{result['last_loss']:.3f}", f"{result['train_seconds']:.0f}"])
    header = [first, *(f"{name} ({tokens} tokens)" for name, tokens in lengths.items()), "final train loss", "train s"]
    return "\n".join("|" + "|".join(f" {cell} " for cell in cells) + "|"
                     for cells in [header, ["---"] * len(header), *lines]).replace("| --- ", "|---")


def needle_eta_sweep() -> str:
    """experiments/needle/results/eta_sweep/eta_<high>/needle.json and results/needle.json (eta on the gradient)."""
    return _needle("eta_range", NEEDLE_ETA_SWEEP)


def needle_corrected() -> str:
    """experiments/needle/results/corrected/needle.json: the Atlas row."""
    return _needle("model", NEEDLE_CORRECTED)


def needle_ablations() -> str:
    """experiments/needle/results/corrected/needle.json: Atlas, its one-knob ablations and Titans."""
    return _needle("model (one knob from Atlas)", NEEDLE_ABLATIONS)


def needle_eta_current() -> str:
    """experiments/needle/results/eta_sweep_current/eta_<high>/needle.json and corrected/needle.json."""
    return _needle("eta_range", NEEDLE_ETA_CURRENT)


def needle_before() -> str:
    """experiments/needle/results/needle.json: the models before the defaults followed the paper."""
    return _needle("model", NEEDLE_BEFORE)


RECALL = "experiments/recall/results"


def _compact(header: list[str], rows: list[list[str]], right_from: int | None = None) -> str:
    """A markdown table with ``|---|`` rules (``|---:|`` from column ``right_from`` on)."""
    rule = "|" + "".join("---:|" if right_from is not None and index >= right_from else "---|"
                         for index in range(len(header)))
    return "\n".join(["| " + " | ".join(header) + " |", rule,
                      *(("| " + " | ".join(cells) + " |").replace("|  |", "| |") for cells in rows)])


def _recall(run: str, variant: str, pairs: int = 4) -> dict:
    """The result of ``variant`` with ``pairs`` key-value pairs in ``RECALL/<run>/recall.json``."""
    report = _json(f"{RECALL}/{run}/recall.json")
    (result,) = [r for r in report["results"] if r["variant"] == variant and r["num_pairs"] == pairs]
    return result


def _accuracy(run: str, variant: str, pairs: int = 4) -> str:
    return f"{_recall(run, variant, pairs)['accuracy']:.3f}"


def _recall_trained(run: str, variant: str) -> list[str]:
    """4-pair accuracy, final training loss, training seconds."""
    result = _recall(run, variant)
    return [f"{result['accuracy']:.3f}", f"{result['final_train_loss']:.2f}", f"{result['train_seconds']:.0f}"]


RECALL_GRID = [("Transformer++ (attention)", "attention"), ("attention + short conv on q, k, v (K=4)", "attention+conv"),
               *((name, name) for name in ("mamba2", "deltanet", "gated_deltanet", "muonssm_mamba2",
                                           "muonssm_gated_deltanet"))]
RECALL_ATLAS = [("attention + short conv (K=4)", "attention+conv"), ("gated_deltanet", "gated_deltanet"),
                ("atlas", "atlas"), ("titans", "titans"), ("omeganet (ns_steps 0)", "omeganet (atlas ns_steps 0)"),
                ("atlas window 1", "atlas window 1"), ("atlas poly_degree 1", "atlas poly_degree 1"),
                ("atlas linear memory", "atlas linear memory")]
RECALL_CORRECTED = ["mamba2", "muonssm_mamba2", "longhorn", "muonssm_longhorn", "muonssm_gated_deltanet"]
RECALL_UPDATE = ["atlas", "atlas window 1", "atlas poly_degree 1", "atlas linear memory"]
RECALL_ETA = ["0.02", "0.05", "0.1", "0.2"]


def recall_grid() -> str:
    """experiments/recall/results/grid/recall.json: answer accuracy per mixer with 4 and 8 pairs."""
    rows = [[label, _accuracy("grid", variant, 4), _accuracy("grid", variant, 8)] for label, variant in RECALL_GRID]
    return _compact(["mixer", "T=64, 4 pairs", "T=64, 8 pairs"], rows)


def recall_atlas() -> str:
    """experiments/recall/results/atlas/recall.json: 4-pair accuracy, final training loss, training seconds."""
    return _compact(["mixer", "T=64, 4 pairs", "final train loss", "train s"],
                    [[label, *_recall_trained("atlas", variant)] for label, variant in RECALL_ATLAS], 1)


def recall_grid_corrected() -> str:
    """experiments/recall/results/grid_corrected/recall.json, and grid/recall.json for the mixers it has."""
    grid = {r["variant"] for r in _json(f"{RECALL}/grid/recall.json")["results"]}
    rows = [[name, _accuracy("grid_corrected", name, 4), _accuracy("grid_corrected", name, 8),
             f"{_accuracy('grid', name, 4)} / {_accuracy('grid', name, 8)}" if name in grid else "(new mixer)"]
            for name in RECALL_CORRECTED]
    return _compact(["mixer", "T=64, 4 pairs", "T=64, 8 pairs", "before (`results/grid/`, 4 / 8 pairs)"], rows)


def recall_ns_scope() -> str:
    """experiments/recall/results/ns_scope/recall.json (both scopes) and grid/recall.json (the per-head rule)."""
    name = "muonssm_gated_deltanet"
    rows = [[f"{name}, `ns_scope: {scope}`" + " (default)" * (scope == "all"),
             *(_accuracy("ns_scope", f"{name} ns_scope {scope}", pairs) for pairs in (4, 8))] for scope in ("all", "head")]
    rows.append(["(`results/grid/`, before `ns_scope` existed: the per-head rule)",
                 *(_accuracy("grid", name, pairs) for pairs in (4, 8))])
    return _compact(["mixer", "T=64, 4 pairs", "T=64, 8 pairs"], rows)


def recall_atlas_update() -> str:
    """experiments/recall/results/atlas_update/recall.json, against atlas/recall.json (eta on the gradient);
    the ``ns_steps: 0`` rows are atlas/recall.json's."""
    rows = [[name, *_recall_trained("atlas_update", name), _accuracy("atlas", name)] for name in RECALL_UPDATE]
    for label, variant in (("omeganet (ns_steps 0; `results/atlas/`, unchanged rule)", "omeganet (atlas ns_steps 0)"),
                           ("titans (`results/atlas/`, unchanged rule)", "titans")):
        rows.append([label, *_recall_trained("atlas", variant), _accuracy("atlas", variant)])
    return _compact(["mixer", "T=64, 4 pairs", "final train loss", "train s", "before (eta on the gradient)"], rows, 1)


def recall_atlas_corrected() -> str:
    """experiments/recall/results/atlas_corrected/recall.json and atlas_corrected_rest/recall.json, against
    atlas_update/recall.json (OmegaNet: atlas/recall.json)."""
    rows = [[name, *_recall_trained("atlas_corrected", name), _accuracy("atlas_update", name)]
            for name in ("atlas", "atlas poly_degree 1")]
    rows.append(["atlas linear memory", *_recall_trained("atlas_corrected_rest", "atlas linear memory"),
                 _accuracy("atlas_update", "atlas linear memory")])
    rows.append(["omeganet (ns_steps 0)", *_recall_trained("atlas_corrected_rest", "omeganet (ns_steps 0)"),
                 f"{_accuracy('atlas', 'omeganet (atlas ns_steps 0)')} (`results/atlas/`)"])
    rows.append(["atlas window 1", *_recall_trained("atlas_corrected_rest", "atlas window 1"),
                 _accuracy("atlas_update", "atlas window 1")])
    return _compact(["mixer", "T=64, 4 pairs", "final train loss", "train s",
                     "`results/atlas_update/` (eta [0, 0.1], earlier window form)"], rows, 1)


def recall_eta() -> str:
    """experiments/recall/results/eta_current/eta_<high>/recall.json (one run each, so its wall seconds are
    the run's) and, for 0.05, atlas_corrected/recall.json's Atlas row (a run of two variants: no wall s)."""
    rows = []
    for high in RECALL_ETA:
        if high == "0.05":
            result, label, wall = _recall("atlas_corrected", "atlas"), "[0, 0.05] (`results/atlas_corrected/`, the default)", ""
        else:
            report = _json(f"{RECALL}/eta_current/eta_{high}/recall.json")
            (result,) = report["results"]
            label, wall = f"[0, {high}]", f"{report['wall_seconds']:.0f}"
            assert result["variant"] == f"atlas eta [0, {high}]", result["variant"]
        rows.append([label, f"{result['accuracy']:.3f}", f"{result['final_train_loss']:.2f}",
                     f"{result['answer_loss']:.2f}", f"{result['train_seconds']:.0f}", wall])
    return _compact(["eta_range", "T=64, 4 pairs", "final train loss", "held-out answer loss", "train s", "wall s"],
                    rows, 1)


TPU_AOT = "benchmarks/results/tpu_aot/tpu_aot.json"


def tpu_aot() -> str:
    """benchmarks/results/tpu_aot/tpu_aot.json: every row that compiled (the failures are in the text), its
    parameters, per-chip temporaries and peak memory, XLA's FLOPs per chip per step, Mosaic calls and
    compile seconds."""
    gib = 2.0 ** 30
    rows = []
    for row in _json(TPU_AOT)["rows"]:
        if "error" in row:
            continue
        rows.append([row["arch"], row["size"], f"{row['topology']} ({row['device_kind']} x {row['num_devices']})",
                     f"{row['num_params'] / 1e6:.0f}M", f"{row['temp_bytes'] / gib:.2f}", f"{row['peak_bytes'] / gib:.2f}",
                     f"{row['flops'] / 1e12:.1f}", str(row["mosaic_kernels"]), f"{row['compile_seconds']:.0f}"])
    return _compact(["arch", "size", "topology", "params", "temps GiB", "peak GiB", "TFLOPs / chip / step",
                     "Mosaic calls", "compile s"], rows)


PARITY = "results/export_parity/parity.json"


def export_parity() -> str:
    """results/export_parity/parity.json (``export_parity.py --json``): per causal model its mixers (an AHN
    model's compressor, window and how far it moves the logits), the exported class, the max abs logit
    difference of whole rows and of cache decoding, the logit scale and whether the greedy tokens agree."""
    rows = []
    for record in _json(PARITY)["causal"]:
        mixers = ", ".join(record["mixers"])
        if record["kind"] == "ahn":
            ahn = record["ahn"]
            mixers += (f" + {ahn['compressor']} compressor (window {ahn['window']}, {ahn['sinks']} sinks; "
                       f"moves the logits by {record['compressor_effect']:.2f})")
        rows.append([record["name"], mixers, record["architecture"], f"{record['max_abs']:.2e}",
                     f"{record['cached_max_abs']:.2e}", f"{record['logit_scale']:.2f}", str(record["greedy_equal"])])
    return _compact(["config", "mixers", "exported as", "max abs logit diff", "decoded from the cache", "logit scale",
                     "16 greedy tokens equal"], rows)


def export_parity_looped() -> str:
    """results/export_parity/parity.json: per looped variant its block mixer, the exported class, the max abs
    difference of the vocabulary logits and whether accept / reject agree on the 64 strings."""
    rows = [[record["name"], record["block_mixer"], record["architecture"], f"{record['max_abs']:.2e}",
             "all equal" if record["decisions_equal"] else "not all equal"] for record in _json(PARITY)["looped"]]
    return _compact(["looped variant", "block mixer", "exported as", "max abs logit diff",
                     "accept / reject on 64 strings"], rows)


ANCHORS = "benchmarks/anchors"
ANCHOR_FILES = tuple(f"{ANCHORS}/h200-probe-{name}.jsonl" for name in ("jax", "pallas-fla", "torch"))


def _probe(test: str, shape=None) -> dict:
    """The one record of ``test`` (and ``shape``) in the anchors' JSON lines."""
    records = [json.loads(line) for path in ANCHOR_FILES for line in (ROOT / path).read_text().splitlines() if line]
    (record,) = [r for r in records if r["test"] == test and (shape is None or r.get("shape") == shape)]
    return record


def _ms(record: dict) -> str:
    return f"{record['s'] * 1e3:.2f} ms"


def _tflops(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def anchors() -> str:
    """benchmarks/anchors/h200-probe-*.jsonl: each probe's median seconds and the rate it records (GB/s,
    TFLOP/s or M tokens/s)."""
    copy = _probe("copy_bw")
    scan = [4, 8192, 4096]
    chunk = [8, 4096, 16, 128]
    assoc = _probe("diag_scan_assoc", scan)
    rows = [["copy (x + 1, f32, XLA)", "1 GiB in, 1 GiB out", _ms(copy), f"{copy['GBps'] / 1e3:.2f} TB/s"]]
    matmul = _probe("matmul_bf16")
    rows.append(["bf16 matmul (XLA)", f"{matmul['n']}^3", _ms(matmul), f"{matmul['TFLOPs']:.0f} TFLOP/s"])
    triton = _probe("pallas_triton_matmul")
    rows.append(["bf16 matmul (plain Pallas Triton kernel, 128x128x64 tiles)", f"{triton['n']}^3", _ms(triton),
                 f"{triton['TFLOPs']:.0f} TFLOP/s"])
    cudnn, pallas_attention = _probe("cudnn_attention"), _probe("pallas_ops_gpu_attention")
    rows.append(["causal attention, cuDNN via jax.nn.dot_product_attention", "B8 T4096 H16 D128 bf16", _ms(cudnn),
                 f"{cudnn['TFLOPs']:.0f} TFLOP/s"])
    rows.append(["causal attention, deprecated pallas.ops.gpu.attention", "same", _ms(pallas_attention),
                 f"{pallas_attention['TFLOPs']:.0f} TFLOP/s"])
    rows.append(["diagonal scan h=a*h+b, lax.associative_scan", "B4 T8192 D4096 f32", _ms(assoc),
                 f"{assoc['GBps_effective'] / 1e3:.2f} TB/s effective "
                 f"({100 * assoc['GBps_effective'] / copy['GBps']:.0f}% of copy)"])
    rows.append(["same, fwd+bwd", "same", _ms(_probe("diag_scan_assoc_fwdbwd", scan)), ""])
    lax_scan = _probe("diag_scan_lax_scan", scan)
    rows.append(["same, lax.scan over T", "same", f"{lax_scan['s'] * 1e3:.0f} ms", f"{lax_scan['GBps_effective']:.0f} GB/s"])
    sequential = _probe("diag_scan_pallas_seq", scan)
    rows.append([f"same, naive Pallas Triton (sequential over T, {sequential['bd']} channels/program)", "same",
                 _ms(sequential), f"{sequential['GBps_effective'] / 1e3:.2f} TB/s"])
    for label, test, prefix in (
            ("scalar-decay chunked linear attention (SSD / simple GLA), pure JAX, chunk 64", "ssd_chunked_xla_fwd", "fwd "),
            ("same, fwd+bwd", "ssd_chunked_xla_fwdbwd", ""),
            ("same op, flash-linear-attention 0.6 (Triton, PyTorch)", "fla_simple_gla_fwd", "fwd "),
            ("gated delta rule, flash-linear-attention 0.6", "fla_gated_delta_fwd", "fwd ")):
        record = _probe(test, chunk)
        rows.append([label, "B8 T4096 H16 K=V=128 bf16" if test == "ssd_chunked_xla_fwd" else "same",
                     prefix + _ms(record), f"{record['Mtok_per_s']:.1f} M tok/s"])
    for label, shape in (("Newton–Schulz 5 steps bf16 (XLA)", [4096, 4096]), ("same", [4096, 11008]),
                         ("same, batched", [1024, 128, 128]), ("same, batched", [256, 64, 64]),
                         ("same, batched", [64, 1024, 1024])):
        record = _probe("newton_schulz_xla", shape)
        size = "x".join(map(str, shape)) if len(shape) == 2 else f"{shape[0]} x {shape[1]}x{shape[2]}"
        rows.append([label, size, _ms(record), f"{_tflops(record['TFLOPs'])} TFLOP/s"])
    eager, compiled = _probe("newton_schulz_torch", [1024, 128, 128]), _probe("newton_schulz_torch_compile", [1024, 128, 128])
    rows.append(["Newton–Schulz, PyTorch eager / torch.compile", "1024 x 128x128",
                 f"{eager['s'] * 1e3:.2f} / {compiled['s'] * 1e3:.2f} ms",
                 f"{_tflops(eager['TFLOPs'])} / {_tflops(compiled['TFLOPs'])} TFLOP/s"])
    return _compact(["what", "shape", "time", "rate"], rows)


def _long(*names: str) -> tuple[str, ...]:
    return tuple(f"{CFL}/long/{name}.json" for name in names)


# name: (README, the results files it is generated from, generator)
TABLES = {
    "memory-sweep": ("results/sweeps/memory/README.md", ("results/sweeps/memory/results.json",), memory_sweep),
    "ahn-loss": ("experiments/ahn/README.md", ("experiments/ahn/results/ahn.json",), ahn_loss),
    "cfl-grid": ("experiments/cfl/README.md", (f"{CFL}/grid/cfl.json",), cfl_grid),
    "cfl-long-width64": ("experiments/cfl/README.md", _long("dyck2_bfvp", "marked_palindrome_dyck1"), cfl_long_width64),
    "cfl-long-width128": ("experiments/cfl/README.md", _long("dyck2_d128", "marked_palindrome_d128"),
                          cfl_long_width128),
    "cfl-recipes": ("experiments/cfl/README.md", _long(*CFL_RECIPES), cfl_recipes),
    "cfl-batch128": ("experiments/cfl/README.md", _long(*CFL_BATCH128), cfl_batch128),
    "cfl-lengths-to-12": ("experiments/cfl/README.md", _long(*CFL_LENGTHS_TO_12), cfl_lengths_to_12),
    "cfl-heldout": ("experiments/cfl/README.md", _long(*(f"heldout/{name}" for _, name in CFL_HELDOUT)), cfl_heldout),
    "cfl-batch256": ("experiments/cfl/README.md", _long(*(name for name, _ in CFL_BATCH256)), cfl_batch256),
    "cfl-heldout-batch256": ("experiments/cfl/README.md", _long(*(f"heldout/{name}" for _, name in CFL_HELDOUT_BATCH256)),
                             cfl_heldout_batch256),
    "cfl-continued": ("experiments/cfl/README.md", _long("bfvp_batch256_loops2_sinusoidal_4k", *(
        f"bfvp_continued_{step}" for step, _ in CFL_CONTINUED)), cfl_continued),
    "cfl-continued-heldout": ("experiments/cfl/README.md", _long(*(f"heldout/{name}" for _, name in CFL_CONTINUED_HELDOUT)),
                              cfl_continued_heldout),
    **{name: ("experiments/needle/README.md", tuple(sorted({f"{NEEDLE}/{path}" for _, path, _ in rows})), generate)
       for name, rows, generate in (("needle-eta-sweep", NEEDLE_ETA_SWEEP, needle_eta_sweep),
                                    ("needle-corrected", NEEDLE_CORRECTED, needle_corrected),
                                    ("needle-ablations", NEEDLE_ABLATIONS, needle_ablations),
                                    ("needle-eta-current", NEEDLE_ETA_CURRENT, needle_eta_current),
                                    ("needle-before", NEEDLE_BEFORE, needle_before))},
    **{name: ("experiments/recall/README.md", tuple(f"{RECALL}/{run}/recall.json" for run in runs), generate)
       for name, runs, generate in (
           ("recall-grid", ["grid"], recall_grid), ("recall-atlas", ["atlas"], recall_atlas),
           ("recall-grid-corrected", ["grid_corrected", "grid"], recall_grid_corrected),
           ("recall-ns-scope", ["ns_scope", "grid"], recall_ns_scope),
           ("recall-atlas-update", ["atlas_update", "atlas"], recall_atlas_update),
           ("recall-atlas-corrected", ["atlas_corrected", "atlas_corrected_rest", "atlas_update", "atlas"],
            recall_atlas_corrected),
           ("recall-eta", [f"eta_current/eta_{high}" for high in RECALL_ETA if high != "0.05"] + ["atlas_corrected"],
            recall_eta))},
    "tpu-aot": ("benchmarks/results/tpu_aot/README.md", (TPU_AOT,), tpu_aot),
    "anchors": ("benchmarks/anchors/README.md", ANCHOR_FILES, anchors),
    "export-parity": ("README.md", (PARITY,), export_parity),
    "export-parity-looped": ("README.md", (PARITY,), export_parity_looped),
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
        readme, sources, generate = TABLES[name]
        table = generate()
        if committed_table(name) == table:
            continue
        stale.append(f"{name} in {readme} (from {', '.join(sources)})")
        if not args.check:
            path = ROOT / readme
            path.write_text(_block(name).sub(lambda m: m.group(1) + table + m.group(3), path.read_text(), count=1))
    if stale:
        print(("out of date: " if args.check else "rewrote: ") + "; ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
