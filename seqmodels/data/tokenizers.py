"""Tokenizers: text <-> int32 token ids.

``ByteTokenizer`` maps text to its UTF-8 bytes: ids 0..255 are bytes, 256 is BOS (start of a
document), 257 is EOS (end of a document); ``vocab_size`` = 258. ``encode`` returns the bytes only;
the data pipeline frames each document as ``document_ids()`` = ``(BOS, EOS)`` around them.
``data.tokenizer: hf:DIR`` is a Hugging Face directory's tokenizer (``seqmodels.data.hf_tokenizer``), with
the same ``encode`` / ``decode`` / ``vocab_size`` / ``document_ids`` interface. Training a BPE
tokenizer is a builder: ``python -m seqmodels.data.builders.tokenizer train``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from seqmodels.data.errors import DataError

BOS_ID = 256
EOS_ID = 257


class ByteTokenizer:
    """UTF-8 bytes as tokens, plus BOS and EOS.

    ``decode(encode(text)) == text`` for every str; ``decode`` skips BOS/EOS and replaces byte
    sequences that are not valid UTF-8 (a document cut mid-character) with U+FFFD.
    """

    name = "byte"
    vocab_size = 258
    bos_id = BOS_ID
    eos_id = EOS_ID

    def encode(self, text: str | bytes) -> np.ndarray:
        """The UTF-8 bytes of ``text`` as an int32 array ``[len(text.encode())]`` (no BOS/EOS)."""
        if isinstance(text, str):
            data = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:
            raise ValueError(f"text must be str or bytes, got {type(text).__name__}")
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def document_ids(self) -> tuple[int, int]:
        """``(open, close)``: the ids that frame a document."""
        return self.bos_id, self.eos_id

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ``ids`` (a 1-D sequence of ids in [0, 258)); BOS/EOS are skipped."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"ids must be a 1-D integer sequence, got shape {ids.shape}, "
                             f"dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ids must lie in [0, {self.vocab_size}), got values in "
                             f"[{ids.min()}, {ids.max()}]")
        data = ids[ids < 256].astype(np.uint8).tobytes()
        return data.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=8)
def _hf_tokenizer(directory: str):
    from seqmodels.errors import HFFormatError
    from seqmodels.data.hf_tokenizer import load_tokenizer
    try:
        tokenizer = load_tokenizer(directory)
        tokenizer.document_ids()  # refuses a tokenizer without an end-of-document token now, not mid-pipeline
    except HFFormatError as error:
        raise DataError(f"data.tokenizer: {error}") from None
    return tokenizer


_TOKENIZERS = {"byte": ByteTokenizer}
_TOKENIZER_PREFIXES = {"hf:": _hf_tokenizer}  # data.tokenizer values "PREFIX<argument>"


def get_tokenizer(name: str):
    """The tokenizer called ``name`` (``data.tokenizer``): ``byte``, or ``hf:DIR``."""
    if name in _TOKENIZERS:
        return _TOKENIZERS[name]()
    for prefix, make in _TOKENIZER_PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return make(name[len(prefix):])
    raise ValueError(f"data.tokenizer: unknown tokenizer {name!r}; known: {', '.join(sorted(_TOKENIZERS))}, "
                     f"{', '.join(prefix + 'DIR' for prefix in _TOKENIZER_PREFIXES)}")

