"""Record corpora: the sources ``jsonl`` and ``parquet`` (Hugging Face ``datasets`` exports and the like).

* ``jsonl``: the files matching ``data.path`` (sorted); each non-blank line is a JSON object and its
  ``data.text_field`` string is one document. Listing scans each file once for line offsets;
  ``docs[i]`` then reads and parses line ``i`` only.
* ``parquet``: the files matching ``data.path`` (sorted); each row's ``data.text_field`` column is one
  document (read with ``pyarrow``; only that column is loaded, row group by row group on demand).

A document's identity (for the hash split of ``document_split.py``) is ``<file relative to the glob's
fixed prefix>:<row>``. A record whose field is missing or not a string raises ``DataError`` naming the
file, the row and ``data.text_field``. Rows with an empty text are kept (they frame to an empty
document). ``document_rows.py`` packs these documents into rows like every other corpus.
"""

from __future__ import annotations

import bisect
import functools
import glob
import json
import os
from collections.abc import Sequence

import numpy as np

from seqmodels.config import DataConfig
from seqmodels.data.document_files import glob_root
from seqmodels.data.document_rows import corpus_source, require_path
from seqmodels.data.errors import DataError
from seqmodels.data.sources import register_source


def _matching_files(cfg: DataConfig) -> tuple[list[str], str]:
    origin = f"data.path={cfg.path!r} (data.source={cfg.source!r})"
    files = sorted(p for p in glob.glob(os.path.expanduser(cfg.path), recursive=True) if os.path.isfile(p))
    if not files:
        raise DataError(f"{origin}: no file matches this glob (relative to {os.getcwd()})")
    return files, origin


class RowDocuments(Sequence):
    """Documents that are rows of record files; ``docs[i]`` reads row ``rows[i]`` of the files (global index).

    ``num_bytes`` counts the files on disk (``bytes_counted = "files"``).
    """

    bytes_counted = "files"

    def __init__(self, reader, rows: Sequence[int], origin: str):
        self.reader = reader  # JsonlReader | ParquetReader over every file
        self.rows = np.asarray(rows, dtype=np.int64)
        self.origin = origin

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.subset(range(len(self))[index])
        return self.reader.text(int(self.rows[index]))

    def subset(self, indices: Sequence[int]) -> RowDocuments:
        return RowDocuments(self.reader, self.rows[np.asarray(indices, dtype=np.int64)], self.origin)

    @property
    def identities(self) -> tuple[str, ...]:
        return tuple(self.reader.identity(int(row)) for row in self.rows)

    @property
    def num_bytes(self) -> int:
        """Bytes of the files on disk."""
        return self.reader.num_bytes


class _RowFiles:
    """Global row index -> (file, row within it), over files of known row counts."""

    def __init__(self, files: Sequence[str], counts: Sequence[int], pattern: str, field: str, origin: str):
        self.files, self.field, self.origin = list(files), field, origin
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        root = glob_root(pattern)
        self.names = [os.path.relpath(f, root or ".") for f in files]
        self.num_bytes = sum(os.path.getsize(f) for f in files)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, row: int) -> tuple[int, int]:
        file_index = bisect.bisect_right(self.starts.tolist(), row) - 1
        return file_index, row - int(self.starts[file_index])

    def identity(self, row: int) -> str:
        file_index, local = self.locate(row)
        return f"{self.names[file_index]}:{local}"

    def field_error(self, file_index: int, local: int, found) -> DataError:
        return DataError(f"{self.origin}: {self.files[file_index]} row {local}: data.text_field={self.field!r} "
                         f"is {'missing' if found is None else type(found).__name__}, expected a string; set "
                         "data.text_field to the field that holds the text")


@functools.lru_cache(maxsize=32)
def _line_offsets(path: str, mtime: float, size: int) -> np.ndarray:
    """Byte offsets of the non-blank lines of ``path`` (cached while its mtime and size stay the same)."""
    offsets, position = [], 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                offsets.append(position)
            position += len(line)
    return np.asarray(offsets, dtype=np.int64)


class JsonlReader(_RowFiles):
    def __init__(self, files: Sequence[str], pattern: str, field: str, origin: str):
        self.offsets = [_line_offsets(f, os.path.getmtime(f), os.path.getsize(f)) for f in files]
        super().__init__(files, [len(o) for o in self.offsets], pattern, field, origin)

    def text(self, row: int) -> str:
        file_index, local = self.locate(row)
        with open(self.files[file_index], "rb") as handle:
            handle.seek(int(self.offsets[file_index][local]))
            line = handle.readline()
        try:
            record = json.loads(line)
        except ValueError as error:
            raise DataError(f"{self.origin}: {self.files[file_index]} row {local}: not a JSON line ({error})") from None
        found = record.get(self.field) if isinstance(record, dict) else None
        if not isinstance(found, str):
            raise self.field_error(file_index, local, found)
        return found


class ParquetReader(_RowFiles):
    def __init__(self, files: Sequence[str], pattern: str, field: str, origin: str):
        import pyarrow.parquet as pq

        self._files = []
        for path in files:
            try:
                parquet = pq.ParquetFile(path)
            except Exception as error:  # pyarrow raises ArrowInvalid / OSError subclasses
                raise DataError(f"{origin}: {path} is not a readable Parquet file ({error})") from None
            if field not in parquet.schema_arrow.names:
                raise DataError(f"{origin}: {path} has no column data.text_field={field!r}; its columns: "
                                f"{', '.join(parquet.schema_arrow.names)}")
            groups = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
            self._files.append((parquet, np.concatenate([[0], np.cumsum(groups)]).astype(np.int64)))
        self._cache: tuple[int, int, list] | None = None
        super().__init__(files, [int(starts[-1]) for _, starts in self._files], pattern, field, origin)

    def text(self, row: int) -> str:
        file_index, local = self.locate(row)
        parquet, starts = self._files[file_index]
        group = bisect.bisect_right(starts.tolist(), local) - 1
        if self._cache is None or self._cache[:2] != (file_index, group):
            try:
                column = parquet.read_row_group(group, columns=[self.field]).column(0).to_pylist()
            except Exception as error:  # pyarrow: OSError / ArrowInvalid for damaged pages, UnicodeDecodeError
                raise DataError(f"{self.origin}: {self.files[file_index]} row group {group} cannot be read "
                                f"({type(error).__name__}: {str(error)[:200]}); the file is damaged") from None
            self._cache = (file_index, group, column)
        found = self._cache[2][local - int(starts[group])]
        if not isinstance(found, str):
            raise self.field_error(file_index, local, found)
        return found


def jsonl_corpus(cfg: DataConfig) -> tuple[RowDocuments, str]:
    """``data.source=jsonl``: (a document per JSON line's ``data.text_field``, ``data.path``)."""
    files, origin = _matching_files(cfg)
    reader = JsonlReader(files, cfg.path, cfg.text_field, origin)
    if not len(reader):
        raise DataError(f"{origin}: the {len(files)} matching files hold no JSON lines")
    return RowDocuments(reader, np.arange(len(reader)), origin), cfg.path


def parquet_corpus(cfg: DataConfig) -> tuple[RowDocuments, str]:
    """``data.source=parquet``: (a document per row's ``data.text_field`` column, ``data.path``)."""
    files, origin = _matching_files(cfg)
    reader = ParquetReader(files, cfg.path, cfg.text_field, origin)
    if not len(reader):
        raise DataError(f"{origin}: the {len(files)} matching files hold no rows")
    return RowDocuments(reader, np.arange(len(reader)), origin), cfg.path


register_source("jsonl", corpus_source(jsonl_corpus, check=require_path))
register_source("parquet", corpus_source(parquet_corpus, check=require_path))
