"""A document corpus's documents, split into train and held-out by a hash of each document's identity.

``load_documents(cfg)`` lists the documents of the configured corpus (its source's ``documents``
hook, ``seqmodels.data.sources``), keeps the first ``data.max_documents`` of them (0: all), then
splits them. Held-out split: document ``d`` is held out iff ``u(d) < data.heldout_fraction`` where
``u(d) = blake2b(identity(d)) / 2**64`` is uniform in [0, 1) and ``identity`` is the file's path
relative to the glob's fixed prefix (the stdlib root for ``stdlib``), ``<file>:<row>`` for record
files, or the record's global index for shards. A document's side therefore does not depend on the
seed, on ``max_documents`` or on which other files exist. With two or more documents each side gets
at least one (the lowest ``u`` is held out if none is, the highest goes back to train if all are).
With ``data.heldout_path`` set there is no hash split: every document of ``data.path`` (capped by
``max_documents``) trains and the documents of ``data.heldout_path``, read by the same source, are
held out (a corpus's own validation split).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from seqmodels.config import DataConfig
from seqmodels.data.errors import DataError
from seqmodels.data.sources import get_source, source_names


class Documents(Protocol):
    """An ordered, lazily read list of text documents: a corpus, or its train or held-out part.

    ``docs[i]`` reads document ``i`` (a str); ``identities[i]`` names it for the split;
    ``subset(indices)`` keeps those documents in that order. ``num_bytes`` counts what
    ``bytes_counted`` says: ``"documents"``, these documents' own bytes, or ``"files"`` /
    ``"shards"``, the bytes on disk of the files or shards that store the whole corpus (the same for
    every subset: counting a subset's own bytes would read every document).
    """

    bytes_counted: str

    @property
    def identities(self) -> Sequence[str]: ...

    @property
    def num_bytes(self) -> int: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str: ...

    def subset(self, indices: Sequence[int]) -> Documents: ...


@dataclasses.dataclass(frozen=True)
class DocumentSplit:
    """The documents of one configured source, split into train and held-out."""

    source: str
    location: str
    train: Documents
    heldout: Documents

    def describe(self) -> str:
        """One line for the training log."""
        if self.train.bytes_counted == "documents":
            size = f"{self.train.num_bytes + self.heldout.num_bytes:,} bytes"
        else:
            size = f"{self.train.num_bytes:,} bytes of {self.train.bytes_counted}"
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
