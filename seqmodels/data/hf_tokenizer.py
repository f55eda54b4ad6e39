"""``load_tokenizer(path)``: a Hugging Face directory's ``tokenizer.json`` through the ``tokenizers`` library.

Special tokens: the BOS / EOS / PAD token strings of ``tokenizer_config.json`` (or
``special_tokens_map.json``), else the ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of
``config.json``; an id is ``None`` where the directory names none. As the data pipeline's tokenizer
(``data.tokenizer: hf:DIR``) a document is framed ``[BOS] tokens [EOS]``; a tokenizer without a BOS
(GPT-2 style) opens documents with its EOS, the separator it was trained with.

``write_byte_level_tokenizer(directory, bos_id=, eos_id=)`` writes the Hugging Face form of the byte-level
tokenizer (``seqmodels.data.tokenizers.ByteTokenizer``): ids 0..255 are the bytes, ``bos_id`` / ``eos_id``
the document marks, so that ``transformers.AutoTokenizer.from_pretrained(directory)`` gives the project's
ids. Its ``tokenizer.json`` is a ``tokenizers`` BPE over the 256 byte symbols of the byte-level
pre-tokenizer (GPT-2's byte -> printable-character table, no regex split, no merges: one token per UTF-8
byte, token id = byte value); ``tokenizer_config.json`` sets ``split_special_tokens`` (the text "<bos>" is
its five bytes, as ``ByteTokenizer`` encodes it) and no clean-up of spaces (decoding is exact). Encoding
with special tokens prepends BOS (how the data pipeline opens a document); the pad token is EOS (the byte
vocabulary has no pad id; padded positions are masked, so the id is never read).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seqmodels.errors import HFFormatError, reading

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
BYTE_LEVEL_SPECIAL_TOKENS = {"bos": "<bos>", "eos": "<eos>"}
_ROLES = ("bos", "eos", "pad")


def _token_string(value):
    """A special token entry: a plain string, or an AddedToken dict ``{"content": ...}``."""
    return value.get("content") if isinstance(value, dict) else value


def _json_or_empty(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise HFFormatError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise HFFormatError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


class HFTokenizer:
    """``encode(text) -> list[int]`` (no special tokens), ``decode(ids) -> str``, and ``bos_id, eos_id, pad_id``."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer

        self.directory = directory
        self.name = f"hf:{directory}"
        try:
            self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as error:  # the tokenizers library raises its own Exception type
            raise HFFormatError(f"{directory / 'tokenizer.json'}: not a readable tokenizer ({error})") from None
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        with reading(directory, "tokenizer's special-token settings"):
            ids = self._special_ids()
        self.bos_id, self.eos_id, self.pad_id = ids["bos"], ids["eos"], ids["pad"]

    def _special_ids(self) -> dict:
        settings = {**_json_or_empty(self.directory / "special_tokens_map.json"),
                    **_json_or_empty(self.directory / "tokenizer_config.json")}
        model = _json_or_empty(self.directory / "config.json")
        ids = {}
        for role in _ROLES:
            token = _token_string(settings.get(f"{role}_token"))
            token_id = self._tokenizer.token_to_id(token) if token else None
            ids[role] = token_id if token_id is not None else model.get(f"{role}_token_id")
            if isinstance(ids[role], list) and ids[role]:  # several ids (e.g. two EOS tokens): the first
                ids[role] = ids[role][0]
            if ids[role] is not None and not (type(ids[role]) is int and 0 <= ids[role] < self.vocab_size):
                raise HFFormatError(f"{self.directory / 'config.json'}: {role}_token_id {ids[role]!r} is not a token "
                                    f"id of the tokenizer (0 .. {self.vocab_size - 1})")
        return ids

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``, without special tokens."""
        if not isinstance(text, str):
            raise ValueError(f"text must be str, got {type(text).__name__}")
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ``ids`` (special tokens skipped)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"ids must be a 1-D integer sequence, got shape {ids.shape}, dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ids must lie in [0, {self.vocab_size}), got values in [{ids.min()}, {ids.max()}]")
        return self._tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    def document_ids(self) -> tuple[int, int]:
        """``(open, close)``: the ids that frame a document, ``(BOS or EOS, EOS)``."""
        if self.eos_id is None:
            raise HFFormatError(f"{self.directory}: the tokenizer names no EOS token (tokenizer_config.json "
                                "eos_token or config.json eos_token_id), which the data pipeline needs to "
                                "separate documents")
        return (self.eos_id if self.bos_id is None else self.bos_id), self.eos_id


def load_tokenizer(path) -> HFTokenizer:
    """The tokenizer of the Hugging Face directory ``path`` (its ``tokenizer.json``)."""
    directory = Path(path)
    if not directory.is_dir():
        raise HFFormatError(f"{directory}: no such directory (expected a Hugging Face model directory)")
    if not (directory / "tokenizer.json").is_file():
        raise HFFormatError(f"{directory}: no tokenizer.json")
    return HFTokenizer(directory)


def byte_symbols() -> list[str]:
    """The printable character the byte-level pre-tokenizer writes for each byte value 0..255 (GPT-2's table:
    the printable Latin-1 bytes stand for themselves, the other 68 take U+0100 onwards in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    symbols, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + shifted)
            shifted += 1
    return [symbols[byte] for byte in range(256)]


def write_byte_level_tokenizer(directory, *, bos_id: int, eos_id: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` of the byte-level tokenizer (module docstring)
    into the existing ``directory``; ``bos_id`` and ``eos_id`` must be 256 and 257 in some order."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if sorted((bos_id, eos_id)) != [256, 257]:
        raise ValueError(f"the byte-level tokenizer's BOS / EOS ids must be 256 and 257 (after the 256 bytes), "
                         f"got bos_id={bos_id}, eos_id={eos_id}")
    directory = Path(directory)
    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    names = BYTE_LEVEL_SPECIAL_TOKENS
    ordered = sorted([(bos_id, names["bos"]), (eos_id, names["eos"])])
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for _, name in ordered])
    for token_id, name in ordered:
        if tokenizer.token_to_id(name) != token_id:
            raise ValueError(f"{name} was given id {tokenizer.token_to_id(name)}, expected {token_id}")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{names['bos']} $A", pair=f"{names['bos']} $A {names['bos']} $B",
        special_tokens=[(names["bos"], bos_id)])
    tokenizer.save(str(directory / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": names["bos"], "eos_token": names["eos"],
                "pad_token": names["eos"], "split_special_tokens": True, "clean_up_tokenization_spaces": False,
                "add_prefix_space": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
