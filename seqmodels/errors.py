"""Errors raised on more than one floor, in a module that imports nothing of the project.

``HFFormatError``: a Hugging Face directory or file (checkpoint, ``config.json``, ``tokenizer.json``) that cannot
be read or written; raised by ``seqmodels.hf`` and by the data pipeline's ``hf:DIR`` tokenizer.
``reading(path, what)`` turns what a parser raises on a malformed file into an ``HFFormatError`` naming it.
``writing(path)`` gives an ``OSError`` raised while writing ``path`` (a full disk on a buffered write or a
flush carries no file name) the name of the file, so the message a user reads says where.
"""

from __future__ import annotations

import contextlib
import struct


class HFFormatError(ValueError):
    """A Hugging Face directory, file or field the interop cannot read or write; the message names it."""


# What a parser raises on content it did not expect: a field of the wrong type, a short read, bad bytes.
MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, EOFError, struct.error)


@contextlib.contextmanager
def reading(path, what: str):
    """Inside, an error that the content of ``path`` causes becomes ``HFFormatError`` naming the file.

    ``what`` says what the file should have been (``"GGUF file"``, ``"config.json"``); errors already
    naming the file pass through unchanged.
    """
    try:
        yield
    except HFFormatError:
        raise
    except OSError as error:
        raise HFFormatError(f"{path}: cannot read the {what}: {error.strerror or error}") from None
    except MALFORMED as error:
        detail = (str(error).strip().splitlines() or [""])[0][:200]
        raise HFFormatError(f"{path}: not a valid {what} ({type(error).__name__}"
                            + (f": {detail}" if detail else "") + ")") from None


@contextlib.contextmanager
def writing(path):
    """Inside, an ``OSError`` that names no file is raised again naming ``path`` (same errno and reason)."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise type(error)(error.errno, error.strerror or str(error), str(path)) from error
