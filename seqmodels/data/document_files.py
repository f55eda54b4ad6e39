"""Documents stored one per file: listing a glob, and reading a file as UTF-8 text when it is asked for.

Listing touches file metadata only (``stat``); ``docs[i]`` reads file ``i``. The files matching a
glob (``**`` recurses) are sorted by their path relative to the glob's fixed prefix (``glob_root``),
which is also each document's identity (what the held-out split of ``document_split.py`` hashes).
Empty files are skipped. Invalid UTF-8 is read as U+FFFD, counted, and reported once per origin
(the config setting that chose the files).
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Sequence

from seqmodels.data.errors import DataError

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
    """Documents stored one per file; ``docs[i]`` reads file ``i`` (UTF-8, invalid bytes replaced).

    ``num_bytes`` counts these documents' own bytes (``bytes_counted = "documents"``).
    """

    bytes_counted = "documents"

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


def cwd_note(pattern: str) -> str:
    """`` (relative to <cwd>)`` for a relative glob, to end a "nothing matches" message; ``""`` for an absolute one."""
    return "" if os.path.isabs(os.path.expanduser(pattern)) else f" (relative to {os.getcwd()})"


def glob_root(pattern: str) -> str:
    """The leading directories of ``pattern`` that hold no wildcard (``a/b/**/*.txt`` -> ``a/b``)."""
    parts = os.path.expanduser(pattern).split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return os.sep.join(fixed) if fixed != [""] else os.sep


def non_empty_files(root: str, relative_paths: Sequence[str], origin: str) -> FileDocuments:
    """The non-empty files among ``relative_paths`` under ``root``, identified by their relative path.

    ``DataError`` naming ``origin`` when every one is empty.
    """
    paths = [os.path.join(root, p) for p in relative_paths]
    sizes = [os.stat(p).st_size for p in paths]
    keep = [i for i, size in enumerate(sizes) if size > 0]
    if not keep:
        raise DataError(f"{origin}: all {len(paths)} matching files are empty")
    return FileDocuments([paths[i] for i in keep], [relative_paths[i] for i in keep],
                         [sizes[i] for i in keep], origin)


def text_file_documents(pattern: str, origin: str | None = None) -> FileDocuments:
    """The files matching ``pattern`` (``data.path``), sorted, identified relative to its fixed prefix.

    ``origin`` names the setting in error messages (default: ``data.path``).
    """
    origin = origin or f"data.path={pattern!r} (data.source='text_files')"
    root = glob_root(pattern)
    relative_pattern = os.path.relpath(os.path.expanduser(pattern), root or ".")
    relative_paths = sorted(p for p in glob.glob(relative_pattern, root_dir=root or None, recursive=True)
                            if os.path.isfile(os.path.join(root, p)))
    if not relative_paths:
        raise DataError(f"{origin}: no file matches this glob{cwd_note(pattern)}")
    return non_empty_files(root, relative_paths, origin)
