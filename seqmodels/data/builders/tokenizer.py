"""Training a byte-level BPE tokenizer with the ``tokenizers`` library.

    python -m seqmodels.data.builders.tokenizer train --input data/debdocs --vocab-size 16384 --out tokenizers/debdocs-16k

Model: GPT-2's byte-level BPE. Text is split by the ``ByteLevel`` pre-tokenizer (GPT-2's regex,
no prefix space) into words whose UTF-8 bytes map to 256 printable characters (with ``--split-digits``, as
SmolLM2's tokenizer does, every digit is first split off as a word of its own, so no token holds two digits
or a digit and a space: a number is one token per digit whatever its neighbours); the trainer starts
from those 256 symbols and ``END_OF_TEXT`` (``<|endoftext|>``, id 0), then repeatedly merges the most
frequent adjacent pair (pairs seen fewer than ``min_frequency`` times are never merged) until the
vocabulary holds ``vocab_size`` tokens. Every string encodes (no unknown token) and
``decode(encode(text)) == text``.

Deterministic: the inputs are read in a fixed order (sorted files, file order within each) and the
trainer breaks count ties by the pair itself, so the same input and options give the same
``tokenizer.json`` byte for byte (tested).

Output directory (read by ``data.tokenizer: hf:DIR`` through ``seqmodels.hf.load_tokenizer``):
``tokenizer.json``, ``tokenizer_config.json`` (``eos_token`` = ``<|endoftext|>``; no BOS, so a
document is framed ``<|endoftext|> ... <|endoftext|>``, as GPT-2 was trained) and ``training.json``
(inputs with sha256, options, the library version).

Inputs (``--input``, ``files.input_files``): a corpus directory of
``python -m seqmodels.data.builders.corpora`` (its ``train.jsonl`` only: validation and test text
never shapes the vocabulary), a ``.jsonl`` file (field ``--text-field``), or a glob of text files
(one document each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from seqmodels.data.builders.files import file_sha256, input_files, iter_texts

END_OF_TEXT = "<|endoftext|>"
_OUTPUT_FILES = ("tokenizer.json", "tokenizer_config.json", "training.json")


def train_bpe(input_spec: str, vocab_size: int, out: str, *, min_frequency: int = 2,
              text_field: str = "text", split_digits: bool = False) -> str:
    """Train the byte-level BPE of the module docstring on ``input_spec``; write it into ``out``; return ``out``."""
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or not 257 <= vocab_size <= 1 << 20:
        raise ValueError(f"--vocab-size must be an int in [257, 2**20] (256 bytes + {END_OF_TEXT}), got {vocab_size!r}")
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"--min-frequency must be an int >= 1, got {min_frequency!r}")
    if not isinstance(split_digits, bool):
        raise ValueError(f"split_digits must be a bool, got {split_digits!r}")
    taken = [name for name in _OUTPUT_FILES if os.path.exists(os.path.join(out, name))]
    if taken:
        raise FileExistsError(f"--out {out!r} already holds {', '.join(taken)}; choose another directory or remove "
                              "them (nothing was overwritten)")
    files = input_files(input_spec)
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                               if split_digits else byte_level)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=[END_OF_TEXT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(iter_texts(files, text_field), trainer=trainer)
    os.makedirs(out, exist_ok=True)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    _write_json(os.path.join(out, "tokenizer_config.json"),
                {"eos_token": END_OF_TEXT, "model_max_length": 1 << 30, "tokenizer_class": "PreTrainedTokenizerFast"})
    _write_json(os.path.join(out, "training.json"),
                {"model": "byte-level BPE", "vocab_size": vocab_size, "trained_vocab_size": tokenizer.get_vocab_size(),
                 "min_frequency": min_frequency, "split_digits": split_digits, "text_field": text_field,
                 "tokenizers_version": tokenizers.__version__,
                 "inputs": [{"path": path, "sha256": file_sha256(path)} for path in files]})
    return out


def _write_json(path: str, value: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
        handle.write("\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m seqmodels.data.builders.tokenizer train --input IN --vocab-size N --out DIR``."""
    parser = argparse.ArgumentParser(prog="python -m seqmodels.data.builders.tokenizer")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a byte-level BPE tokenizer (tokenizer.json)",
                                description=__doc__.split("\n\n")[0])
    train.add_argument("--input", required=True, help="a corpus directory (its train.jsonl), a .jsonl file or a glob")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--out", required=True, help="directory for tokenizer.json (then data.tokenizer=hf:DIR)")
    train.add_argument("--min-frequency", type=int, default=2)
    train.add_argument("--text-field", default="text", help="the JSON field holding the text (.jsonl inputs)")
    train.add_argument("--split-digits", action="store_true", help="every digit a token of its own (as SmolLM2's)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = train_bpe(args.input, args.vocab_size, args.out, min_frequency=args.min_frequency,
                        text_field=args.text_field, split_digits=args.split_digits)
    except (ValueError, FileExistsError, OSError) as error:
        print(f"tokenizers: {error}", file=sys.stderr)
        return 2
    print(f"tokenizers: wrote {out}/tokenizer.json in {time.perf_counter() - start:.0f} s; "
          f"train with data.tokenizer=hf:{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
