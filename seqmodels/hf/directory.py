"""A Hugging Face model directory: checked before anything is read from it; its JSON files read and written."""

from __future__ import annotations

import json
from pathlib import Path

from seqmodels.errors import HFFormatError

REQUIRED_NOTES = {"config.json": " (a Hugging Face model directory has one)"}


def hf_directory(path, required: str = "config.json") -> Path:
    """``path`` as a directory holding the file ``required``, else ``HFFormatError`` saying which is missing."""
    directory = Path(path)
    if not directory.is_dir():
        raise HFFormatError(f"{directory}: no such directory (expected a Hugging Face model directory)")
    if not (directory / required).is_file():
        raise HFFormatError(f"{directory}: no {required}{REQUIRED_NOTES.get(required, '')}")
    return directory


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``HFFormatError`` naming the file when it is not one."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise HFFormatError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise HFFormatError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def write_json(path: Path, value: dict) -> None:
    """``value`` as indented JSON (``config.json``, ``generation_config.json``, ...), with a final newline."""
    Path(path).write_text(json.dumps(value, indent=2) + "\n")
