"""Is a checkpoint step complete? The files orbax and grain must find, checked before anything is restored.

A step directory ``checkpoints/<step>/`` is complete when it holds orbax's ``_CHECKPOINT_METADATA``,
the ``params`` and ``opt_state`` items (each with ``_METADATA`` and its OCDBT ``manifest.ocdbt``),
readable JSON in ``meta/metadata`` and ``config/metadata``, and the data-iterator state of every
process (``data/process_<i>-of-<n>.json``). Damage inside an array chunk (a truncated OCDBT data
file) shows only when the arrays are read, so the restore itself is the last check: a step whose
restore fails is as incomplete as one with a missing file.

A step found incomplete is renamed aside by training to ``checkpoints/<step>.incomplete`` (never
deleted): orbax no longer lists it, so it is neither restored nor rotated, and the user can inspect it.
Readers (evaluation, export) skip it with a warning and change nothing.

``newest_complete`` picks the step to restore and ``restore_with_fallback`` restores it, falling back
past steps that fail to read: training's resume and ``seqmodels.runs.load`` share both, so every tool
restores the same step of a run. A step being written lives in orbax's temporary directory until it is
complete and is not listed; a step a live run rotates out while it is being read is skipped like a
damaged one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

ARRAY_ITEMS = ("params", "opt_state")
JSON_ITEMS = ("meta", "config")
ASIDE_SUFFIX = ".incomplete"


def saved_process_count(step_dir) -> int | None:
    """How many processes saved ``step_dir``'s data-iterator state (from its file names), None when unknown."""
    counts = {int(match.group(1)) for path in (Path(step_dir) / "data").glob("process_*-of-*.json")
              if (match := re.fullmatch(r"process_\d+-of-(\d+)\.json", path.name))}
    return max(counts) if counts else None


def step_problems(step_dir, *, process_count: int | None = 1, with_data: bool = True) -> list[str]:
    """What is missing or unreadable in ``step_dir`` (empty when it looks complete).

    The data-iterator states are checked for the number of processes that wrote the step, as its file names
    say (a run may resume on another number); ``process_count`` is that number when the step holds none
    (``None``: then their absence is a problem).
    """
    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        return ["the step directory is gone (rotated out by a live run?)"]
    problems = []
    if not (step_dir / "_CHECKPOINT_METADATA").is_file():
        problems.append("_CHECKPOINT_METADATA is missing")
    for item in ARRAY_ITEMS:
        if not (step_dir / item).is_dir():
            problems.append(f"{item}/ is missing")
            continue
        problems += [f"{item}/{name} is missing" for name in ("_METADATA", "manifest.ocdbt")
                     if not (step_dir / item / name).is_file()]
        if (step_dir / item / "_METADATA").is_file() and not _is_json(step_dir / item / "_METADATA"):
            problems.append(f"{item}/_METADATA is not readable JSON")
    for item in JSON_ITEMS:
        path = step_dir / item / "metadata"
        if not path.is_file():
            problems.append(f"{item}/metadata is missing")
        elif not _is_json(path):
            problems.append(f"{item}/metadata is not readable JSON (truncated?)")
    if with_data:
        counts = {int(match.group(1)) for path in (step_dir / "data").glob("process_*-of-*.json")
                  if (match := re.fullmatch(r"process_\d+-of-(\d+)\.json", path.name))}
        if len(counts) > 1:
            problems.append(f"data/ holds the data-iterator states of runs of {sorted(counts)} processes")
        process_count = max(counts) if counts else process_count
        if process_count is None:
            problems.append("data/ holds no data-iterator state")
            process_count = 0
        for index in range(process_count):
            path = step_dir / "data" / f"process_{index}-of-{process_count}.json"
            if not path.is_file():
                problems.append(f"data/{path.name} is missing")
            elif not _is_json(path):
                problems.append(f"data/{path.name} is not readable JSON (truncated?)")
    return problems


def set_aside(step_dir) -> Path:
    """Rename an incomplete step out of orbax's sight; returns the new path (``<step>.incomplete[.N]``)."""
    step_dir = Path(step_dir)
    target = step_dir.with_name(step_dir.name + ASIDE_SUFFIX)
    number = 1
    while target.exists():
        number += 1
        target = step_dir.with_name(f"{step_dir.name}{ASIDE_SUFFIX}.{number}")
    step_dir.rename(target)
    return target


def _is_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def newest_saved_step(run_dir) -> int | None:
    """The newest step of ``run_dir/checkpoints`` that looks complete, None when none does (or none is there)."""
    directory = Path(run_dir) / "checkpoints"
    try:
        steps = sorted((int(path.name) for path in directory.iterdir() if path.name.isdigit()), reverse=True)
    except OSError:
        return None
    return next((step for step in steps if not step_problems(directory / str(step), process_count=None)), None)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def newest_complete(directory, steps, incomplete: dict[int, str], *, step: int | None = None,
                    check: Callable[[int], None] = lambda step: None, process_count: int | None = 1) -> int | None:
    """The newest of ``steps`` (or ``step`` alone, when asked for) not in ``incomplete`` that looks complete.

    Steps found incomplete are added to ``incomplete`` with the reason; ``check(step)`` runs on each
    candidate first and raises to refuse the run outright (another process count, another architecture).
    """
    candidates = [step] if step is not None else sorted(steps, reverse=True)
    for candidate in candidates:
        if candidate in incomplete:
            continue
        check(candidate)
        problems = step_problems(Path(directory) / str(candidate), process_count=process_count)
        if problems:
            incomplete[candidate] = "; ".join(problems)
            continue
        return candidate
    return None


def restore_with_fallback(choose: Callable[[], int | None], restore: Callable[[int], object],
                          incomplete: dict[int, str], *, refusals: tuple[type[BaseException], ...] = ()):
    """``(step, restore(step))`` for the step ``choose()`` gives, falling back to the next choice whenever a
    restore fails (the step is added to ``incomplete``); None when no step is left. ``refusals`` are
    exceptions that refuse the run rather than mark a step damaged: they propagate."""
    step = choose()
    while step is not None:
        try:
            return step, restore(step)
        except refusals:
            raise
        except Exception as error:  # noqa: BLE001  (any failure to read a step makes it incomplete)
            incomplete[step] = f"its arrays cannot be read: {first_line(error)}"
        step = choose()
    return None


def describe_incomplete(incomplete: dict[int, str]) -> str:
    return "; ".join(f"step {step}: {problems}" for step, problems in sorted(incomplete.items()))
