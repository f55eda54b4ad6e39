"""Writing documents as ArrayRecord shards of token ids (``python -m seqmodels.data.builders.prepare --tokenizer``).

Each input document becomes one record: its token ids under the tokenizer (no BOS/EOS; the
``token_ids`` source frames documents as every corpus does) as little-endian ``uint16`` when the
vocabulary fits, else ``int32``. Shard ``k`` of ``N`` holds a contiguous run of the documents in input
order; the shards are tokenized and written by ``workers`` processes in parallel. ``tokens.json``
beside them (``shards.TOKEN_METADATA``) records the tokenizer (its name and its fingerprint), the dtype,
the vocabulary, and per shard its documents and tokens. ``data.source=token_ids``
(``seqmodels.data.sources.token_ids``) reads them back.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from seqmodels.data.shards import SHARD_SUFFIX, TOKEN_METADATA, WRITER_OPTIONS, shard_paths, tokenizer_fingerprint
from seqmodels.data.tokenizers import get_tokenizer


def _write_shard(job: tuple) -> dict:
    from array_record.python.array_record_module import ArrayRecordWriter

    path, texts, tokenizer_name, dtype = job
    tokenizer = get_tokenizer(tokenizer_name)
    writer = ArrayRecordWriter(path, WRITER_OPTIONS)
    tokens = 0
    for text in texts:
        ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
        writer.write(ids.astype(dtype).tobytes())
        tokens += ids.size
    writer.close()
    return {"path": os.path.basename(path), "documents": len(texts), "tokens": tokens}


def write_token_shards(texts: Sequence[str], output_dir: str, num_shards: int, tokenizer_name: str, *,
                       prefix: str = "tokens", workers: int = 1) -> dict:
    """Tokenize ``texts`` into ``num_shards`` shards in ``output_dir`` by ``workers`` processes; return the metadata."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be an int >= 1, got {workers!r}")
    tokenizer = get_tokenizer(tokenizer_name)
    dtype = "<u2" if tokenizer.vocab_size <= 1 << 16 else "<i4"
    os.makedirs(output_dir, exist_ok=True)
    taken = os.path.exists(os.path.join(output_dir, TOKEN_METADATA))
    if taken or any(f.endswith(SHARD_SUFFIX) for f in os.listdir(output_dir)):
        raise ValueError(f"--output {output_dir!r} already holds shards; choose an empty directory so that old "
                         "shards do not mix with new ones")
    paths = shard_paths(output_dir, num_shards, prefix)
    bounds = np.linspace(0, len(texts), num_shards + 1).round().astype(int)
    jobs = [(path, list(texts[a:b]), tokenizer_name, dtype) for path, a, b in zip(paths, bounds[:-1], bounds[1:])]
    if workers == 1:
        shards = [_write_shard(job) for job in jobs]
    else:
        # spawn, not fork: the parent may hold JAX / grain threads, which fork would copy mid-flight
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            shards = list(pool.map(_write_shard, jobs))
    metadata = {"tokenizer": tokenizer_name, "tokenizer_sha256": tokenizer_fingerprint(tokenizer_name),
                "vocab_size": tokenizer.vocab_size, "dtype": dtype, "shards": shards,
                "documents": sum(s["documents"] for s in shards), "tokens": sum(s["tokens"] for s in shards)}
    with open(os.path.join(output_dir, TOKEN_METADATA), "w") as handle:
        json.dump(metadata, handle, indent=2)
    return metadata
