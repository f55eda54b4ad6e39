"""README tables of the context-free-language experiments (``experiments/cfl``)."""

from __future__ import annotations

import re

from readme_format import emphasised, load_json, markdown_table


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
    return load_json(f"{CFL}/long/{name}.json")


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
    report = load_json(f"{CFL}/grid/cfl.json")
    longest = report["train_lengths"][1]
    rows = []
    for name, result in report["variants"].items():
        cells = [cell for per_length in result["accuracy"].values() for cell in per_length.values()]
        rows.append([name, f"{_cfl_mean(c['accuracy'] for c in cells if c['length'] <= longest):.3f}",
                     f"{_cfl_mean(c['accuracy'] for c in cells if c['length'] > longest):.3f}"])
    return markdown_table(["variant", f"mean accuracy, N <= {longest}", f"mean accuracy, N > {longest}"], rows, 1)


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
    return markdown_table(header, rows, 1)


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
        cells += [emphasised(f"{accuracy[str(n)]:.3f}", (name, n) in bold) for n in report["eval_lengths"]]
        rows.append(cells + [f"{report['cpu_seconds']:.0f}"])
        longest = report["train_lengths"][1]
        header = (["file"] + (["language"] if language_column else []) + ["overrides"]
                  + [f"{n}" + "*" * (n > longest) for n in report["eval_lengths"]] + ["CPU s"])
    return markdown_table(header, rows, 2 + language_column)


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
                     *(emphasised(f"{accuracy[str(n)]:.3f}", "batch" in name and "d128" not in name)
                       for n in report["eval_lengths"]), f"{report['cpu_seconds']:.0f}"])
    return markdown_table(["file", "d_model, lr", "batch", "8", "10", "12", "CPU s"], rows, 2)


def _cfl_heldout(name: str) -> dict[int, float]:
    report = load_json(f"{CFL}/long/heldout/{name}.json")
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
                     emphasised(_mean_text(sum(values) / len(values)), name in bold_mean), f"{min(values):.3f}"])
    return rows


def cfl_heldout() -> str:
    """experiments/cfl/results/long/heldout/<language>.json (512 strings per even N, seed 4321): the range
    of accuracy over N = 2..12, accuracy at N = 16..32, the mean over every scored N and the lowest."""
    shown = [16, 20, 24, 28, 32]
    return markdown_table(["language (run)", "N = 2..12", *map(str, shown), "mean, N = 2..32", "lowest"],
                  _heldout_rows(CFL_HELDOUT, 12, shown, set()), 1)


def cfl_heldout_batch256() -> str:
    """experiments/cfl/results/long/heldout/bfvp_{5000_steps,batch256_4000_steps,batch128_8000_steps}.json:
    as ``cfl_heldout``."""
    shown = [14, 16, 18, 20, 24, 28, 32]
    return markdown_table(["run", "N = 2..12", *map(str, shown), "mean, N = 2..32", "lowest"],
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
                     *(emphasised(f"{accuracy[n]:.3f}", step == 6800 and n <= 32) for n in lengths)])
    return markdown_table(["step", "phase", *(f"{n}" + "*" * (n > 32) for n in lengths)], rows, 2, right_first=True)


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
        rows.append([label, short_text, *(emphasised(f"{accuracy[n]:.3f}", accuracy[n] < 0.6) for n in shown),
                     emphasised(f"{lowest:.3f}", final) + f" (N = {where})",
                     emphasised(f"{sum(accuracy.values()) / len(accuracy):.3f}", final)])
    return markdown_table(["step", "N = 1..10", *map(str, shown), "lowest, N <= 32", "mean"], rows, 2, right_first=True)
