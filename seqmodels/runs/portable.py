"""Paths as a results file records them: relative to the repository, never one machine's absolute path.

A committed results file is read on other machines, so the commands and settings it records name
paths the way a reader re-runs them from the repository root: an absolute path inside the repository
becomes relative to it (``<repository>/.venv/bin/python`` -> ``.venv/bin/python``), and one outside
it keeps only its last component (``--out <scratch>/aot_a`` -> ``--out aot_a``, a directory the re-run
creates in the repository). ``portable`` applies this to every absolute path inside a string, list or dict.
"""

from __future__ import annotations

import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]

# An absolute path: a slash at the start of the string or after a separator a command line or an
# override puts before a value (space, =, quote, bracket, comma, colon, backtick, parenthesis).
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[\s=\"'\[,:`(]))/[^\s\"'\],`()]+")


def portable_path(path: str, root: Path | str = REPOSITORY) -> str:
    """``path`` relative to ``root`` when inside it, its last component when absolute elsewhere."""
    if not isinstance(path, str):
        raise TypeError(f"portable_path: path must be a str, got {type(path).__name__}")
    if not path.startswith("/"):
        return path
    root = Path(root).resolve()
    candidate = Path(path)
    if candidate == root:
        return "."
    if candidate.is_relative_to(root):
        return str(candidate.relative_to(root))
    return candidate.name or "."


def portable(value, root: Path | str = REPOSITORY):
    """``value`` (a str, or lists / tuples / dicts of them, other leaves unchanged) with every absolute
    path it holds made portable by ``portable_path``."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda match: portable_path(match.group(0), root), value)
    if isinstance(value, dict):
        return {key: portable(item, root) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(portable(item, root) for item in value)
    return value
