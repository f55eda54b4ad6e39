"""RULER-style long-context suite: greedy generation on RULER's synthetic tasks, scored as RULER scores them.

Prompts come from ``seqmodels.data.ruler_tasks`` (its docstring says how each task follows RULER's
definition and where it differs): niah (single, multi-key, multi-value, multi-query needles on noise,
text and needle haystacks), variable tracking, common and frequent word extraction, at each of the
requested lengths (tokens of the run's tokenizer, prompt + generated tokens) and needle depths.
The text haystack is the run's held-out documents (``data.heldout_path`` or the hash split of its
corpus), in a seeded random order; a run trained on a generated task has no held-out text, and its
text haystack is the held-out split of the ``stdlib`` corpus.

Decoding: ``seqmodels.models.generate``, greedy, ``max_new_tokens`` after the prompt (the task's longest
reference answer plus a few tokens), cut at the first end-of-document token and decoded with the run's
tokenizer, then RULER's ``postprocess_pred`` (strip; control characters become newlines). Score per
example, RULER's ``string_match_all``: the fraction of references that occur (case-insensitive) in the
continuation; every task here uses it in RULER (``string_match_part``, the best single reference, is
RULER's QA metric and is given for completeness). A cell's score is the mean over its examples, a
fraction in [0, 1] (RULER prints it x100), with a 95 % percentile-bootstrap interval over the examples
(``seqmodels.evaluation.intervals``).

A length above ``model.max_seq_len`` (the model's positions are bounded there: ``generate`` refuses it)
is left out with a message, and a task whose template, needles and answer cannot fit a length is
reported for that length as skipped with the tokens it needs.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import defaultdict

import numpy as np

from seqmodels.config_base import ConfigError
from seqmodels.data.document_split import load_documents
from seqmodels.data.heldout_sample import sample_order
from seqmodels.data.ruler_tasks import DEPTH_TASKS, TASKS, essay_from, needs_essay, ruler_examples
from seqmodels.data.sources import get_source
from seqmodels.data.tokenizers import get_tokenizer
from seqmodels.evaluation.decoding import greedy_continuations
from seqmodels.evaluation.intervals import bootstrap_interval

_CONTROL = re.compile(r"[\x00-\x1f]")
HAYSTACK_TOKENS_PER_LENGTH = 4  # held-out text read for the essay haystack: this many times the longest length


def postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references) -> float:
    """The fraction of ``references`` contained in ``prediction``, ignoring case (RULER's metric, per example)."""
    if not references:
        raise ValueError("references must not be empty")
    return sum(r.lower() in prediction.lower() for r in references) / len(references)


def string_match_part(prediction: str, references) -> float:
    """1.0 when any reference is contained in ``prediction`` (RULER's QA metric, per example)."""
    if not references:
        raise ValueError("references must not be empty")
    return float(any(r.lower() in prediction.lower() for r in references))


METRICS = {task: string_match_all for task in TASKS}  # RULER's scripts/eval/synthetic/constants.py


def haystack_sentences(data_config, seed: int, needed_chars: int) -> list[str]:
    """Sentences of the run's held-out documents (else the stdlib corpus's), documents in seeded random order."""
    source = get_source(data_config.source)
    if source.documents is None:
        data_config = dataclasses.replace(data_config, source="stdlib", path="", heldout_path="", max_documents=0)
    heldout = load_documents(data_config).heldout
    if not len(heldout):
        raise ConfigError(f"data.source={data_config.source!r}: no held-out documents for the text haystack")
    return essay_from(heldout, sample_order(len(heldout), seed), needed_chars)


def _continuation_text(tokenizer, ids: np.ndarray) -> str:
    _, close = tokenizer.document_ids()
    stops = np.flatnonzero(ids == close)
    return postprocess(tokenizer.decode(ids[:stops[0]] if stops.size else ids))


def evaluate_cell(model, tokenizer, examples, *, batch_size: int, seed: int) -> dict:
    """Score one task at one length: ``{"score", "interval", "examples", "by_depth", "samples"}``."""
    prompts = np.stack([e.prompt for e in examples])
    continuations = greedy_continuations(model, prompts, examples[0].max_new_tokens, batch_size)
    metric = METRICS[examples[0].task]
    texts = [_continuation_text(tokenizer, ids) for ids in continuations]
    scores = np.array([metric(text, e.references) for text, e in zip(texts, examples)])
    by_depth = defaultdict(list)
    for example, score in zip(examples, scores):
        by_depth["none" if example.depth is None else str(round(example.depth, 4))].append(score)
    return {"score": float(scores.mean()), "interval": bootstrap_interval(scores, seed=seed),
            "examples": len(examples), "max_new_tokens": examples[0].max_new_tokens,
            "by_depth": {depth: float(np.mean(s)) for depth, s in by_depth.items()},
            "samples": [{"references": list(e.references), "prediction": t} for e, t in zip(examples[:2], texts)]}


def check_ruler_settings(tasks, lengths, depths, per_depth: int, max_seq_len: int) -> list[int]:
    """The lengths to evaluate (those ``<= max_seq_len``); ``ConfigError`` naming the bad setting."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ConfigError(f"--ruler-tasks: unknown or no task(s) {unknown}; choose from {', '.join(TASKS)}")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ConfigError(f"--ruler-depths: expected fractions in [0, 1], got {list(depths)}")
    if per_depth < 1:
        raise ConfigError(f"--ruler-examples must be >= 1, got {per_depth}")
    fitting = [n for n in lengths if n <= max_seq_len]
    if not fitting:
        raise ConfigError(f"--lengths {','.join(map(str, lengths))}: every length exceeds model.max_seq_len="
                          f"{max_seq_len}, the longest sequence this model takes; choose lengths <= {max_seq_len}")
    return fitting


def evaluate_ruler(model, config, *, tasks=TASKS, lengths, depths=(0.0, 0.25, 0.5, 0.75, 1.0), per_depth: int = 4,
                   seed: int = 42, batch_size: int = 8, on_cell=None) -> dict:
    """Every task at every length (module docstring); JSON-ready. ``on_cell(task, length, cell, seconds)``, when
    given, is called after each cell (a progress report: a long length takes minutes per cell on a CPU)."""
    max_seq_len = model.config.max_seq_len
    fitting = check_ruler_settings(tasks, lengths, depths, per_depth, max_seq_len)
    tokenizer = get_tokenizer(config.data.tokenizer)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ConfigError(f"ruler: data.tokenizer={config.data.tokenizer!r} has {tokenizer.vocab_size} ids, more than "
                          f"model.vocab_size={model.config.vocab_size}: the model cannot read the prompts")
    sentences = (haystack_sentences(config.data, seed, HAYSTACK_TOKENS_PER_LENGTH * max(fitting))
                 if needs_essay(tasks) else [])
    results = {}
    for task in tasks:
        cells = {}
        for length in fitting:
            try:
                examples = ruler_examples(task, tokenizer, length=length, depths=depths, per_depth=per_depth,
                                          seed=seed, sentences=sentences)
            except ValueError as error:
                cells[str(length)] = {"skipped": str(error)}
                continue
            start = time.perf_counter()
            cells[str(length)] = evaluate_cell(model, tokenizer, examples, batch_size=batch_size, seed=seed)
            if on_cell is not None:
                on_cell(task, length, cells[str(length)], time.perf_counter() - start)
        results[task] = {"metric": METRICS[task].__name__, "has_depth": task in DEPTH_TASKS, "by_length": cells}
    return {"tasks": results, "lengths": fitting, "depths": [float(d) for d in depths], "per_depth": per_depth,
            "seed": seed, "skipped_lengths": {str(n): f"exceeds model.max_seq_len={max_seq_len}"
                                              for n in lengths if n > max_seq_len},
            "interval": "95 % percentile bootstrap over examples",
            "score": "fraction of references found in the greedy continuation (RULER reports x100)"}


def markdown_table(result: dict) -> str:
    """Task x length: score [95 % interval]; a skipped cell shows why."""
    lengths = [str(n) for n in result["lengths"]]
    lines = ["| task | " + " | ".join(lengths) + " |", "|---|" + "---|" * len(lengths)]
    for task, entry in result["tasks"].items():
        cells = []
        for length in lengths:
            cell = entry["by_length"][length]
            if "skipped" in cell:
                cells.append("skipped (too short)")
            else:
                low, high = cell["interval"]["low"], cell["interval"]["high"]
                cells.append(f"{cell['score']:.2f} [{low:.2f}, {high:.2f}]")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    skipped = "".join(f"\nlength {n} left out: {why}." for n, why in result["skipped_lengths"].items())
    return ("\n".join(lines) + f"\n\nScore: {result['score']}; [low, high]: {result['interval']}, "
            f"{result['per_depth']} examples per depth at depths {result['depths']} (cwe / fwe: as many, "
            f"without depth); seed {result['seed']}.{skipped}\n")


def plot_heatmap(result: dict, task: str, path) -> None:
    """A PNG of one task's score by depth (rows) and length (columns); cwe / fwe have one row, no depth."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    entry = result["tasks"][task]
    lengths = [str(n) for n in result["lengths"]]
    depths = [str(round(d, 4)) for d in result["depths"]] if entry["has_depth"] else ["none"]
    grid = np.full((len(depths), len(lengths)), np.nan)
    for j, length in enumerate(lengths):
        by_depth = entry["by_length"][length].get("by_depth", {})
        for i, depth in enumerate(depths):
            grid[i, j] = by_depth.get(depth, np.nan)
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2.5, 0.5 * len(depths) + 2))
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        ax.text(j, i, "–" if np.isnan(value) else f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), lengths)
    ax.set_yticks(range(len(depths)), depths if entry["has_depth"] else ["(no depth)"])
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(f"{task}: {entry['metric']}")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
