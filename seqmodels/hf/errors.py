"""The one error the Hugging Face interop raises for bad input: a file, and what is wrong with it."""

from __future__ import annotations


class HFFormatError(ValueError):
    """A Hugging Face directory, file or field the interop cannot read or write; the message names it."""
