"""Is a checkpoint step complete? The files orbax and grain must find, checked before anything is restored.

A step directory ``checkpoints/<step>/`` is complete when it holds orbax's ``_CHECKPOINT_METADATA``,
the ``params`` and ``opt_state`` items (each with ``_METADATA`` and its OCDBT ``manifest.ocdbt``),
readable JSON in ``meta/metadata`` and ``config/metadata``, and the data-iterator state of every
process (``data/process_<i>-of-<n>.json``). Damage inside an array chunk (a truncated OCDBT data
file) shows only when the arrays are read, so the restore itself is the last check: a step whose
restore fails is as incomplete as one with a missing file.

A step found incomplete is renamed aside to ``checkpoints/<step>.incomplete`` (never deleted): orbax
no longer lists it, so it is neither restored nor rotated, and the user can inspect it.
"""

from __future__ import annotations

import json
from pathlib import Path

ARRAY_ITEMS = ("params", "opt_state")
JSON_ITEMS = ("meta", "config")
ASIDE_SUFFIX = ".incomplete"


def step_problems(step_dir, *, process_count: int = 1, with_data: bool = True) -> list[str]:
    """What is missing or unreadable in ``step_dir`` (empty when it looks complete); the data positions are
    checked for the number of processes that wrote them (``process_count`` when none is there)."""
    step_dir = Path(step_dir)
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
        # as many files as processes wrote the step (whatever the number now)
        counts = {int(f.stem.rsplit("-of-", 1)[1]) for f in (step_dir / "data").glob("process_*-of-*.json")
                  if f.stem.rsplit("-of-", 1)[1].isdigit()}
        if len(counts) > 1:
            problems.append(f"data/ holds the positions of runs of {sorted(counts)} processes")
        process_count = max(counts) if counts else process_count
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
