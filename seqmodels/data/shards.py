"""ArrayRecord shards as ``python -m seqmodels.data.builders.prepare`` writes them and the sources read them.

Shard ``k`` of ``N`` is ``<dir>/<prefix>-0000k-of-0000N.array_record``, written with ``group_size:1``
(one record per chunk: grain needs that for fast random access). Shards of token ids
(``prepare --tokenizer``, read by ``data.source=token_ids``) have ``tokens.json`` beside them, which
names the tokenizer by its fingerprint (the sha256 of its ``tokenizer.json``), so that a reader can
refuse shards written with another tokenizer.
"""

from __future__ import annotations

import hashlib
import os

SHARD_SUFFIX = ".array_record"
WRITER_OPTIONS = "group_size:1"
TOKEN_METADATA = "tokens.json"


def shard_paths(output_dir: str, num_shards: int, prefix: str = "documents") -> list[str]:
    """``<output_dir>/<prefix>-00000-of-0000N.array_record`` for each shard."""
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {num_shards!r}")
    return [os.path.join(output_dir, f"{prefix}-{k:05d}-of-{num_shards:05d}{SHARD_SUFFIX}")
            for k in range(num_shards)]


def tokenizer_fingerprint(name: str) -> str:
    """sha256 of the tokenizer's ``tokenizer.json`` (``hf:DIR``), or the name itself for built-in tokenizers."""
    if name.startswith("hf:"):
        with open(os.path.join(name[3:], "tokenizer.json"), "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    return name
