"""Document corpora: an ordered, deterministic, lazily read list of text documents per source.

Corpora (``data.source``; ``text.py`` registers them and turns their documents into rows):

* ``stdlib``: the ``.py`` files of the running Python's standard library
  (``sysconfig.get_paths()["stdlib"]``, recursive, sorted, ``site-packages`` skipped). Present on
  every machine, so the default needs no download.
* ``text_files``: the files matching the glob ``data.path`` (``**`` recurses), sorted.
* ``jsonl``, ``parquet``: a document per record's ``data.text_field`` (``records.py``).
* ``arrayrecord``: the records of the ArrayRecord shards matching ``data.path`` (sorted), each
  record one UTF-8 document, read through ``grain.sources.ArrayRecordDataSource``. Shards are
  written by ``python -m seqmodels.data.builders.prepare``.

Listing a source touches file metadata only (``stat``, shard headers); ``docs[i]`` reads document
``i`` when it is asked for. Empty files are skipped. ``data.max_documents`` keeps the first that
many documents of the sorted list, then the split below is applied.

Held-out split: document ``d`` is held out iff ``u(d) < data.heldout_fraction`` where
``u(d) = blake2b(identity(d)) / 2**64`` is uniform in [0, 1) and ``identity`` is the file's path
relative to the glob's fixed prefix (the stdlib root for ``stdlib``) or the record's global index.
A document's side therefore does not depend on the seed, on ``max_documents`` or on which other
files exist. With two or more documents each side gets at least one (the lowest ``u`` is held out
if none is, the highest goes back to train if all are). With ``data.heldout_path`` set there is no
hash split: every document of ``data.path`` (capped by ``max_documents``) trains and the documents
of ``data.heldout_path``, read by the same source, are held out (a corpus's own validation split).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import sys
import sysconfig
from collections.abc import Sequence

import numpy as np

from seqmodels.config import ConfigError, DataConfig
from seqmodels.data.sources import get_source, source_names

_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


class DataError(ValueError):
    """The data cannot be loaded as configured; the message names the config key and its value."""


_REPORTED_INVALID_UTF8: set[str] = set()


def decode_document(data: bytes, origin: str, name: str) -> str:
    """UTF-8 text of a document; invalid byte sequences become U+FFFD, counted and reported once per origin.

    The first document of ``origin`` (the setting that chose the documents) holding invalid UTF-8 prints
    one warning to stderr with its count; later ones are replaced silently, as the warning says.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
    if origin not in _REPORTED_INVALID_UTF8:
        _REPORTED_INVALID_UTF8.add(origin)
        invalid = text.count("\ufffd") - data.count("\ufffd".encode())
        print(f"warning: {origin}: {name} holds {invalid} invalid UTF-8 byte sequence(s), read as U+FFFD; other "
              "documents of this source with invalid UTF-8 are replaced the same way without a further warning",
              file=sys.stderr, flush=True)
    return text


class FileDocuments(Sequence):
    """Documents stored one per file; ``docs[i]`` reads file ``i`` (UTF-8, invalid bytes replaced)."""

    def __init__(self, paths: Sequence[str], identities: Sequence[str], sizes: Sequence[int],
                 origin: str):
        self.paths = tuple(paths)
        self.identities = tuple(identities)
        self.sizes = tuple(int(s) for s in sizes)
        self.origin = origin  # the config setting that chose these files, for error messages

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.subset(range(len(self))[index])
        path = self.paths[index]
        try:
            with open(path, "rb") as handle:
                return decode_document(handle.read(), self.origin, path)
        except OSError as error:
            raise DataError(f"{self.origin}: cannot read {path}: {error}") from error

    def subset(self, indices: Sequence[int]) -> FileDocuments:
        return FileDocuments([self.paths[i] for i in indices], [self.identities[i] for i in indices],
                             [self.sizes[i] for i in indices], self.origin)

    @property
    def num_bytes(self) -> int:
        return sum(self.sizes)


class RecordDocuments(Sequence):
    """Documents stored as ArrayRecord records; ``docs[i]`` reads record ``record_indices[i]``."""

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


Documents = FileDocuments | RecordDocuments


@dataclasses.dataclass(frozen=True)
class DocumentSplit:
    """The documents of one configured source, split into train and held-out."""

    source: str
    location: str
    train: Documents
    heldout: Documents

    def describe(self) -> str:
        """One line for the training log."""
        if isinstance(self.train, FileDocuments):
            size = f"{self.train.num_bytes + self.heldout.num_bytes:,} bytes"
        else:
            stored = "shards" if isinstance(self.train, RecordDocuments) else "files"
            size = f"{self.train.num_bytes:,} bytes of {stored}"
        return (f"data: {self.source} ({self.location}): {len(self.train)} train / "
                f"{len(self.heldout)} held-out documents, {size}")


def heldout_scores(identities: Sequence[str]) -> np.ndarray:
    """``u(d) = blake2b(identity(d)) / 2**64`` per document: stable across runs and machines."""
    digests = [hashlib.blake2b(i.encode("utf-8"), digest_size=8).digest() for i in identities]
    return np.array([int.from_bytes(d, "little") for d in digests], dtype=np.float64) / 2.0**64


def split_indices(identities: Sequence[str], heldout_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, held-out indices), each ascending; see the module docstring for the rule."""
    scores = heldout_scores(identities)
    heldout = scores < heldout_fraction
    if len(scores) >= 2 and not heldout.any():
        heldout[np.argmin(scores)] = True
    if len(scores) >= 2 and heldout.all():
        heldout[np.argmax(scores)] = False
    return np.flatnonzero(~heldout), np.flatnonzero(heldout)


def _cwd_note(pattern: str) -> str:
    return "" if os.path.isabs(os.path.expanduser(pattern)) else f" (relative to {os.getcwd()})"


def _list_files(root: str, pattern: str) -> list[str]:
    return sorted(p for p in glob.glob(pattern, root_dir=root or None, recursive=True)
                  if os.path.isfile(os.path.join(root, p)))


def _non_empty(root: str, relative_paths: Sequence[str], origin: str) -> FileDocuments:
    paths = [os.path.join(root, p) for p in relative_paths]
    sizes = [os.stat(p).st_size for p in paths]
    keep = [i for i, size in enumerate(sizes) if size > 0]
    if not keep:
        raise DataError(f"{origin}: all {len(paths)} matching files are empty")
    return FileDocuments([paths[i] for i in keep], [relative_paths[i] for i in keep],
                         [sizes[i] for i in keep], origin)


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
    return _non_empty(root, sorted(relative_paths), origin)


def glob_root(pattern: str) -> str:
    """The leading directories of ``pattern`` that hold no wildcard (``a/b/**/*.txt`` -> ``a/b``)."""
    parts = os.path.expanduser(pattern).split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return os.sep.join(fixed) if fixed != [""] else os.sep


def text_file_documents(pattern: str, origin: str | None = None) -> FileDocuments:
    """The files matching ``pattern`` (``data.path``), sorted, identified relative to its fixed prefix.

    ``origin`` names the setting in error messages (default: ``data.path``).
    """
    origin = origin or f"data.path={pattern!r} (data.source='text_files')"
    root = glob_root(pattern)
    relative_pattern = os.path.relpath(os.path.expanduser(pattern), root or ".")
    relative_paths = _list_files(root, relative_pattern)
    if not relative_paths:
        raise DataError(f"{origin}: no file matches this glob{_cwd_note(pattern)}")
    return _non_empty(root, relative_paths, origin)


def arrayrecord_documents(pattern: str) -> RecordDocuments:
    """Every record of the ArrayRecord shards matching ``pattern`` (sorted), in shard order."""
    import grain
    from array_record.python.array_record_module import ArrayRecordReader

    origin = f"data.path={pattern!r} (data.source='arrayrecord')"
    shards = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
                    if os.path.isfile(p))
    if not shards:
        raise DataError(f"{origin}: no shard matches this glob{_cwd_note(pattern)}; "
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


def require_path(cfg: DataConfig) -> None:
    """The check of the corpora read from ``data.path``."""
    if not cfg.path:
        raise ConfigError(f"data.path: data.source={cfg.source} needs data.path (a glob of files)")


def load_documents(cfg: DataConfig) -> DocumentSplit:
    """The documents of ``cfg.source`` (a registered corpus), capped at ``data.max_documents``, split train/held-out."""
    source = get_source(cfg.source)
    if source.documents is None:
        corpora = [name for name in source_names() if get_source(name).documents is not None]
        raise DataError(f"data.source: {cfg.source!r} is generated, not a document corpus; "
                        f"corpora: {', '.join(corpora)}")
    source.check(cfg)
    documents, location = source.documents(cfg)
    if cfg.max_documents:
        documents = documents[: cfg.max_documents]
    if cfg.heldout_path:
        heldout, heldout_location = source.documents(dataclasses.replace(cfg, path=cfg.heldout_path))
        return DocumentSplit(cfg.source, f"{location}; held out: {heldout_location}", documents, heldout)
    train, heldout = split_indices(documents.identities, cfg.heldout_fraction)
    return DocumentSplit(cfg.source, location, documents.subset(train), documents.subset(heldout))

