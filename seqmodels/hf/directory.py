"""A Hugging Face model directory, checked before anything is read from it."""

from __future__ import annotations

from pathlib import Path

from seqmodels.hf.errors import HFFormatError

REQUIRED_NOTES = {"config.json": " (a Hugging Face model directory has one)"}


def hf_directory(path, required: str = "config.json") -> Path:
    """``path`` as a directory holding the file ``required``, else ``HFFormatError`` saying which is missing."""
    directory = Path(path)
    if not directory.is_dir():
        raise HFFormatError(f"{directory}: no such directory (expected a Hugging Face model directory)")
    if not (directory / required).is_file():
        raise HFFormatError(f"{directory}: no {required}{REQUIRED_NOTES.get(required, '')}")
    return directory
