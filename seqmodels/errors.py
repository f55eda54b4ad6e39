"""Errors raised on more than one floor, in a module that imports nothing of the project.

``HFFormatError``: a Hugging Face directory or file (checkpoint, ``config.json``, ``tokenizer.json``) that cannot
be read or written; raised by ``seqmodels.hf`` and by the data pipeline's ``hf:DIR`` tokenizer.
"""

from __future__ import annotations


class HFFormatError(ValueError):
    """A Hugging Face directory, file or field the interop cannot read or write; the message names it."""
