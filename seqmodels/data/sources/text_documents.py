"""Text documents one per file or per shard record: the sources ``stdlib``, ``text_files`` and ``arrayrecord``.

* ``stdlib``: the ``.py`` files of the running Python's standard library
  (``sysconfig.get_paths()["stdlib"]``, recursive, sorted, ``site-packages`` skipped). Present on
  every machine, so the default needs no download.
* ``text_files``: the files matching the glob ``data.path`` (``**`` recurses), sorted
  (``document_files.text_file_documents``).
* ``arrayrecord``: the records of the ArrayRecord shards matching ``data.path`` (sorted), each
  record one UTF-8 document, read through ``grain.sources.ArrayRecordDataSource``. Shards are
  written by ``python -m seqmodels.data.builders.prepare``.

Listing a source touches file metadata only (``stat``, shard headers); ``docs[i]`` reads document
``i`` when it is asked for. Empty files are skipped. The documents are split by
``document_split.load_documents`` and packed into rows by ``document_rows.corpus_source``.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Sequence

import grain
import numpy as np

from seqmodels.config import DataConfig
from seqmodels.data.document_files import (FileDocuments, cwd_note, decode_document, non_empty_files,
                                           text_file_documents)
from seqmodels.data.document_rows import corpus_source, require_path
from seqmodels.data.errors import DataError
from seqmodels.data.sources import register_source

_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


class RecordDocuments(Sequence):
    """Documents stored as ArrayRecord records; ``docs[i]`` reads record ``record_indices[i]``.

    ``num_bytes`` counts the shards on disk (``bytes_counted = "shards"``).
    """

    bytes_counted = "shards"

    def __init__(self, source, record_indices: Sequence[int], shard_bytes: int, origin: str):
        self.source = source  # grain.sources.ArrayRecordDataSource over every shard
        self.record_indices = np.asarray(record_indices, dtype=np.int64)
        self.shard_bytes = shard_bytes
        self.origin = origin

    def __len__(self) -> int:
        return len(self.record_indices)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.subset(range(len(self))[index])
        record = int(self.record_indices[index])
        try:
            data = self.source[record]
        except (RuntimeError, OSError, ValueError) as error:
            raise DataError(f"{self.origin}: cannot read record {record}: {error}") from error
        return decode_document(bytes(data), self.origin, f"record {record}")

    def subset(self, indices: Sequence[int]) -> RecordDocuments:
        return RecordDocuments(self.source, self.record_indices[np.asarray(indices, dtype=np.int64)],
                               self.shard_bytes, self.origin)

    @property
    def identities(self) -> tuple[str, ...]:
        return tuple(f"record:{i}" for i in self.record_indices)

    @property
    def num_bytes(self) -> int:
        """Bytes of the shards on disk (compressed); reading every record to count is not worth it."""
        return self.shard_bytes


def stdlib_documents() -> FileDocuments:
    """The standard library's ``.py`` files, sorted by path relative to the stdlib root."""
    root = sysconfig.get_paths()["stdlib"]
    relative_paths = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS)
        base = os.path.relpath(directory, root)
        relative_paths += [os.path.normpath(os.path.join(base, f)) for f in files if f.endswith(".py")]
    origin = f"data.source='stdlib' (standard library at {root})"
    if not relative_paths:
        raise DataError(f"{origin}: no .py files found")
    return non_empty_files(root, sorted(relative_paths), origin)


def arrayrecord_documents(pattern: str) -> RecordDocuments:
    """Every record of the ArrayRecord shards matching ``pattern`` (sorted), in shard order."""
    from array_record.python.array_record_module import ArrayRecordReader

    origin = f"data.path={pattern!r} (data.source='arrayrecord')"
    shards = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
                    if os.path.isfile(p))
    if not shards:
        raise DataError(f"{origin}: no shard matches this glob{cwd_note(pattern)}; "
                        "write shards with `python -m seqmodels.data.builders.prepare`")
    ranges = []
    for shard in shards:
        try:
            reader = ArrayRecordReader(shard)
            ok, count = reader.ok(), reader.num_records()
            reader.close()
        except (RuntimeError, OSError, ValueError) as error:
            ok, count = False, f"{error}"
        if not ok:
            raise DataError(f"{origin}: {shard} is not a readable ArrayRecord shard ({count})")
        if count:
            ranges.append(f"{shard}[0:{count}]")  # grain then skips re-opening to count records
    if not ranges:
        raise DataError(f"{origin}: the {len(shards)} matching shards hold no records")
    source = grain.sources.ArrayRecordDataSource(ranges)
    shard_bytes = sum(os.stat(s).st_size for s in shards)
    return RecordDocuments(source, np.arange(len(source)), shard_bytes, origin)


def stdlib_corpus(cfg: DataConfig) -> tuple[FileDocuments, str]:
    """``data.source=stdlib``: (the standard library's files, its root)."""
    return stdlib_documents(), sysconfig.get_paths()["stdlib"]


def text_files_corpus(cfg: DataConfig) -> tuple[FileDocuments, str]:
    """``data.source=text_files``: (the files matching ``data.path``, ``data.path``)."""
    return text_file_documents(cfg.path), cfg.path


def arrayrecord_corpus(cfg: DataConfig) -> tuple[RecordDocuments, str]:
    """``data.source=arrayrecord``: (the records of the shards matching ``data.path``, ``data.path``)."""
    return arrayrecord_documents(cfg.path), cfg.path


register_source("stdlib", corpus_source(stdlib_corpus))
register_source("text_files", corpus_source(text_files_corpus, check=require_path))
register_source("arrayrecord", corpus_source(arrayrecord_corpus, check=require_path))
