"""Documents of token ids in ArrayRecord shards: the source ``token_ids``.

The shards are written by ``python -m seqmodels.data.builders.prepare --tokenizer``
(``builders/token_shards.py``): one record per document, its token ids as ``uint16`` or ``int32``,
``tokens.json`` beside them naming the tokenizer and the dtype (``seqmodels.data.shards``).

Reading (``data.path`` = the shards' glob): training process ``p`` of ``n`` reads the shards
``p, p + n, p + 2n, ...`` of the sorted list (so there must be at least ``n`` shards), shuffles their
documents by ``data.seed`` every epoch, frames and packs them like the text corpora
(``document_rows.py``). Held out: the shards of ``data.heldout_path``, or else the hash split of
``document_split.py`` over record identities ``<shard name>:<record>``, applied before the shards are
divided among processes. The configured ``data.tokenizer`` must be the one the shards were written
with (``ConfigError``).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence

import grain
import numpy as np

from seqmodels.config import ConfigError, DataConfig
from seqmodels.data.document_rows import DOCUMENT_READ_OPTIONS, FrameIds, shuffle_seed, tokenizer_vocab_size
from seqmodels.data.document_split import split_indices
from seqmodels.data.errors import DataError
from seqmodels.data.heldout_sample import sampled_heldout_batches
from seqmodels.data.packing import pack_and_batch
from seqmodels.data.shards import TOKEN_METADATA, tokenizer_fingerprint
from seqmodels.data.sources import DataSource, register_source
from seqmodels.data.tokenizers import get_tokenizer


class TokenShardDocuments(Sequence):
    """The records of token-id shards; ``docs[i]`` is record ``records[i]``'s ids (int32)."""

    def __init__(self, source, records: Sequence[int], identities: Sequence[str], dtype: str):
        self.source, self.dtype = source, dtype
        self.records = np.asarray(records, dtype=np.int64)
        self.identities = tuple(identities)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index) -> np.ndarray:
        return np.frombuffer(bytes(self.source[int(self.records[index])]), dtype=self.dtype).astype(np.int32)

    def subset(self, indices) -> TokenShardDocuments:
        indices = np.asarray(indices, dtype=np.int64)
        return TokenShardDocuments(self.source, self.records[indices], [self.identities[i] for i in indices],
                                   self.dtype)


def _shards(pattern: str, key: str) -> list[str]:
    shards = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not shards:
        raise DataError(f"{key}={pattern!r} (data.source='token_ids'): no shard matches this glob; write shards "
                        "with `python -m seqmodels.data.builders.prepare --tokenizer ...`")
    return shards


def _metadata(shards: Sequence[str], cfg: DataConfig, key: str) -> dict:
    directories = sorted({os.path.dirname(s) for s in shards})
    found = []
    for directory in directories:
        path = os.path.join(directory, TOKEN_METADATA)
        if not os.path.isfile(path):
            raise DataError(f"{key}: {directory} has no {TOKEN_METADATA}; these are not token-id shards of "
                            "`python -m seqmodels.data.builders.prepare --tokenizer`")
        with open(path) as handle:
            found.append(json.load(handle))
    for metadata in found:
        if metadata["tokenizer_sha256"] != tokenizer_fingerprint(cfg.tokenizer):
            raise ConfigError(f"data.tokenizer: the shards of {key} were written with {metadata['tokenizer']} "
                              f"(another tokenizer.json than data.tokenizer={cfg.tokenizer!r}); set data.tokenizer "
                              "to it or prepare the shards again")
    if len({m["dtype"] for m in found}) != 1:
        raise DataError(f"{key}: the shards mix dtypes {sorted({m['dtype'] for m in found})}")
    return found[0]


def _documents(shards: Sequence[str], cfg: DataConfig, key: str) -> TokenShardDocuments:
    from array_record.python.array_record_module import ArrayRecordReader

    metadata = _metadata(shards, cfg, key)
    ranges, identities = [], []
    for shard in shards:
        reader = ArrayRecordReader(shard)
        count = reader.num_records()
        reader.close()
        if count:
            ranges.append(f"{shard}[0:{count}]")
            identities += [f"{os.path.basename(shard)}:{i}" for i in range(count)]
    if not ranges:
        raise DataError(f"{key}: the {len(shards)} matching shards hold no records")
    source = grain.sources.ArrayRecordDataSource(ranges)
    return TokenShardDocuments(source, np.arange(len(source)), identities, metadata["dtype"])


def token_documents(cfg: DataConfig, *, process_index: int = 0, process_count: int = 1):
    """(this process's train documents, the held-out documents) of ``data.source=token_ids`` (module docstring)."""
    shards = _shards(cfg.path, "data.path")
    if len(shards) < process_count:
        raise DataError(f"data.path={cfg.path!r}: {len(shards)} shards cannot be split among {process_count} "
                        "processes; write at least one shard per process (prepare --shards)")
    if cfg.heldout_path:
        heldout = _documents(_shards(cfg.heldout_path, "data.heldout_path"), cfg, "data.heldout_path")
        train_keep = None
    else:
        everything = _documents(shards, cfg, "data.path")
        train_keep, heldout_indices = split_indices(everything.identities, cfg.heldout_fraction)
        heldout = everything.subset(heldout_indices)
        train_keep = {everything.identities[i] for i in train_keep}
    mine = _documents(shards[process_index::process_count], cfg, "data.path")
    if train_keep is not None:
        mine = mine.subset([i for i, identity in enumerate(mine.identities) if identity in train_keep])
    return mine, heldout


def token_ids_train(cfg: DataConfig, *, batch_size: int, process_index: int, process_count: int) -> grain.IterDataset:
    mine, _ = token_documents(cfg, process_index=process_index, process_count=process_count)
    stream = grain.MapDataset.source(mine).shuffle(seed=shuffle_seed(cfg.seed)).repeat(None)
    stream = stream.map(FrameIds(*get_tokenizer(cfg.tokenizer).document_ids()))
    return pack_and_batch(stream.to_iter_dataset(DOCUMENT_READ_OPTIONS), seq_len=cfg.seq_len,
                          batch_size=batch_size)


def token_ids_eval(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    _, heldout = token_documents(cfg)
    if not len(heldout):
        raise DataError(f"data.source='token_ids': no held-out documents "
                        f"(data.heldout_fraction={cfg.heldout_fraction})")
    return sampled_heldout_batches(heldout, FrameIds(*get_tokenizer(cfg.tokenizer).document_ids()),
                                   seq_len=cfg.seq_len, batch_size=batch_size, max_batches=max_batches,
                                   seed=cfg.heldout_seed)


def _describe(cfg: DataConfig) -> str:
    mine, heldout = token_documents(cfg)
    return f"data: token_ids ({cfg.path}): {len(mine)} train / {len(heldout)} held-out documents of token ids"


def _check(cfg: DataConfig) -> None:
    if not cfg.path:
        raise ConfigError("data.path: data.source=token_ids needs data.path (a glob of token-id shards)")


register_source("token_ids", DataSource(train=token_ids_train, eval=token_ids_eval, vocab_size=tokenizer_vocab_size,
                                        describe=_describe, check=_check, encodes_text=True))
