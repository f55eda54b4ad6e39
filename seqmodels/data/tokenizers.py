"""Tokenizers: text <-> int32 token ids.

``ByteTokenizer`` maps text to its UTF-8 bytes: ids 0..255 are bytes, 256 is BOS (start of a
document), 257 is EOS (end of a document); ``vocab_size`` = 258. ``encode`` returns the bytes only;
the data pipeline frames each document as ``document_ids()`` = ``(BOS, EOS)`` around them.
``data.tokenizer: hf:DIR`` is a Hugging Face directory's tokenizer (``seqmodels.hf.tokenizer``), with
the same ``encode`` / ``decode`` / ``vocab_size`` / ``document_ids`` interface.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

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
    from seqmodels.data.corpus import DataError
    from seqmodels.hf.errors import HFFormatError
    from seqmodels.hf.tokenizer import load_tokenizer
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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m seqmodels.data.tokenizers train --input IN --vocab-size N --out DIR`` (``seqmodels.data.bpe``)."""
    import argparse
    import sys
    import time

    from seqmodels.data import bpe

    parser = argparse.ArgumentParser(prog="python -m seqmodels.data.tokenizers")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a byte-level BPE tokenizer (tokenizer.json)",
                                description=bpe.__doc__.split("\n\n")[0])
    train.add_argument("--input", required=True, help="a corpus directory (its train.jsonl), a .jsonl file or a glob")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--out", required=True, help="directory for tokenizer.json (then data.tokenizer=hf:DIR)")
    train.add_argument("--min-frequency", type=int, default=2)
    train.add_argument("--text-field", default="text", help="the JSON field holding the text (.jsonl inputs)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = bpe.train_bpe(args.input, args.vocab_size, args.out, min_frequency=args.min_frequency,
                            text_field=args.text_field)
    except (ValueError, FileExistsError, OSError) as error:
        print(f"tokenizers: {error}", file=sys.stderr)
        return 2
    print(f"tokenizers: wrote {out}/tokenizer.json in {time.perf_counter() - start:.0f} s; "
          f"train with data.tokenizer=hf:{out}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
