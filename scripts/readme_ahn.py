"""README tables of the AHN experiment (experiments/ahn/README.md): the smoke run, the paper-setting runs and RULER."""

from __future__ import annotations

from readme_format import load_json


AHN_COMPRESSORS = {"gated_deltanet": "AHN GDN", "deltanet": "AHN DeltaNet", "mamba2": "AHN Mamba2"}


def ahn_loss() -> str:
    """experiments/ahn/results/ahn.json: per length the loss of full attention (the teacher), of the
    sliding window and of each compressor, and the share of the window's gap to full attention that
    the compressor recovers, (window - AHN) / (window - full)."""
    results = load_json("experiments/ahn/results/ahn.json")["results"]
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


AHN_RULER = "experiments/ahn/results/paper"
# ruler_<key>.json: eval.py --ahn-mode teacher / swa / ahn on the Gated DeltaNet run, and --ahn-mode ahn on the
# DeltaNet and Mamba2 runs (teacher and swa decode the frozen base alone: the same for every compressor)
AHN_RULER_MODES = {"teacher": "full attention", "swa": "sliding window + sinks", "ahn": "AHN GDN",
                   "ahn_deltanet": "AHN DeltaNet", "ahn_mamba2": "AHN Mamba2"}
# eval.py --suites ahn of each compressor's run at the paper's setting, on the same held-out rows
AHN_PAPER_EVALS = {"gated_deltanet": "eval.json", "deltanet": "eval_deltanet.json", "mamba2": "eval_mamba2.json"}


def _paper_evals() -> dict:
    evals = {name: load_json(f"{AHN_RULER}/{path}") for name, path in AHN_PAPER_EVALS.items()}
    first = next(iter(evals.values()))
    for name, report in evals.items():
        assert report["step"] == first["step"] and report["ahn"]["compressor"] == name, name
        for row, reference in zip(report["ahn"]["loss"], first["ahn"]["loss"], strict=True):
            # the same rows: the frozen base scores them identically in every run's evaluation
            assert (row["length"], row["rows"], row["tokens"]) == (reference["length"], reference["rows"],
                                                                   reference["tokens"]), name
            assert abs(row["teacher"] - reference["teacher"]) < 1e-4 and abs(row["swa"] - reference["swa"]) < 1e-4
    return evals


def _interval(value: float, interval: dict, scale: float = 1.0, digits: int = 4) -> str:
    return (f"{scale * value:.{digits}f} [{scale * interval['low']:.{digits}f}, "
            f"{scale * interval['high']:.{digits}f}]")


AHN_RULER_8K_MODES = ("teacher", "swa", "ahn")  # the Gated DeltaNet run's three decodings


def ahn_ruler_8k() -> str:
    """experiments/ahn/results/paper/ruler8k_<mode>.json: ``ahn_ruler``'s table at 8,192 tokens."""
    return ahn_ruler("ruler8k", AHN_RULER_8K_MODES)


def ahn_paper_loss() -> str:
    """experiments/ahn/results/paper/eval*.json (``eval.py --suites ahn`` of each compressor's run): per length the
    held-out loss beyond the window of full attention, the sliding window and each compressor, with 95 % intervals
    over the rows, then the needles each retrieves."""
    evals = _paper_evals()
    first = next(iter(evals.values()))["ahn"]
    window = first["window"]
    header = ["T", "rows", "tokens scored", "full attention", "sliding window + sinks",
              *(AHN_COMPRESSORS[name] for name in evals)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in enumerate(first["loss"]):
        cells = [f"{row['length']:,} ({row['length'] // window} x W)", str(row["rows"]), f"{row['tokens']:,}",
                 _interval(row["teacher"], row["interval"]["teacher"]), _interval(row["swa"], row["interval"]["swa"])]
        cells += [_interval(report["ahn"]["loss"][index]["ahn"], report["ahn"]["loss"][index]["interval"]["ahn"])
                  for report in evals.values()]
        lines.append("| " + " | ".join(cells) + " |")
    retrieval = first["retrieval"]
    needles = [f"needles retrieved ({retrieval['examples']}, rows of {retrieval['row_tokens']:,})", "", "",
               *(f"{retrieval[mode]:.2f}" for mode in ("teacher", "swa")),
               *(f"{report['ahn']['retrieval']['ahn']:.2f}" for report in evals.values())]
    lines.append("| " + " | ".join(needles) + " |")
    return "\n".join(lines)


def ahn_paper_gap() -> str:
    """experiments/ahn/results/paper/eval*.json: per length the share of the sliding window's gap to full attention
    that each compressor recovers, (window - AHN) / (window - full), with its 95 % interval over the rows."""
    evals = _paper_evals()
    first = next(iter(evals.values()))["ahn"]
    header = ["T", *(AHN_COMPRESSORS[name] for name in evals)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in enumerate(first["loss"]):
        cells = [f"{row['length']:,} ({row['length'] // first['window']} x W)"]
        for report in evals.values():
            recovered = report["ahn"]["loss"][index]["recovered"]
            cells.append(_interval(recovered["share"], recovered["interval"], scale=100, digits=1) + " %")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ahn_ruler(prefix: str = "ruler", modes: tuple[str, ...] = tuple(AHN_RULER_MODES)) -> str:
    """experiments/ahn/results/paper/<prefix>_<mode>.json (``eval.py --suites ruler --ahn-mode <mode>``): per task
    and length, each mode's score with its 95 % interval over the prompts, and its score at each needle depth."""
    runs = {mode: load_json(f"{AHN_RULER}/{prefix}_{mode}.json")["ruler"] for mode in modes}
    first = runs[modes[0]]
    depths = " / ".join(f"{d:g}" for d in first["depths"])
    header = ["task", "T", *(f"{AHN_RULER_MODES[mode]} (by depth {depths})" for mode in modes)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for task in first["tasks"]:
        for length in map(str, first["lengths"]):
            cells = []
            for mode, ruler in runs.items():
                assert ruler["lengths"] == first["lengths"] and ruler["depths"] == first["depths"], mode
                cell = ruler["tasks"][task]["by_length"][length]
                by_depth = " / ".join(f"{cell['by_depth'][str(float(d))]:g}" for d in first["depths"])
                cells.append(f"{cell['score']:.2f} [{cell['interval']['low']:.2f}, {cell['interval']['high']:.2f}] "
                             f"({by_depth})")
            lines.append(f"| {task} | {int(length):,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
