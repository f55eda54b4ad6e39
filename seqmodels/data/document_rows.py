"""Document corpora as packed token rows: what every document source (``text_documents.py``,
``record_files.py``, ``token_ids.py`` under ``seqmodels.data.sources``) makes its batches with.

Training::

    train documents (document_split.load_documents)
      -> shuffle by data.seed, a new permutation each epoch, repeated forever    (MapDataset)
      -> global stream index i goes to process i % process_count                 (MapDataset slice)
      -> tokenize: [BOS] + tokens + [EOS], loss on every token but BOS           (FrameDocument)
      -> pack into rows of seq_len + 1 tokens, documents continuing across rows  (packing.py)
      -> shift into inputs / targets, batch                                      (IterDataset)

Evaluation packs the held-out sample the same way (``heldout_sample.py``: held-out documents in the
order ``data.heldout_seed`` draws, each cut to one row), one pass; the last batch is padded with all-zero rows. A new corpus is a function ``cfg -> (documents, location)``
(``document_split.Documents``) registered with ``register_source(name, corpus_source(that_function))``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import grain
import numpy as np

from seqmodels.config import ConfigError, DataConfig
from seqmodels.data.document_split import Documents, load_documents
from seqmodels.data.errors import DataError
from seqmodels.data.heldout_sample import sampled_heldout_batches
from seqmodels.data.packing import pack_and_batch
from seqmodels.data.sources import DataSource, no_check
from seqmodels.data.tokenizers import ByteTokenizer, get_tokenizer

# Documents are read and tokenized ahead of the packer by a few threads; one document fills tens of
# rows on average, so a short buffer keeps the packer fed without reading far ahead.
DOCUMENT_READ_OPTIONS = grain.ReadOptions(num_threads=4, prefetch_buffer_size=16)


@dataclasses.dataclass(frozen=True)
class FrameDocument:
    """text -> ``{"tokens": [BOS] + tokens + [EOS], "loss_mask": [0, 1, ..., 1]}`` (int32, float32)."""

    tokenizer: ByteTokenizer

    def __call__(self, text: str) -> dict[str, np.ndarray]:
        body = np.asarray(self.tokenizer.encode(text), np.int32)
        tokens = np.empty(body.size + 2, np.int32)
        (tokens[0], tokens[-1]), tokens[1:-1] = self.tokenizer.document_ids(), body
        loss_mask = np.ones(tokens.size, np.float32)
        loss_mask[0] = 0.0
        return {"tokens": tokens, "loss_mask": loss_mask}


class FrameIds:
    """ids -> ``{"tokens": [open] + ids + [close], "loss_mask": [0, 1, ..., 1]}`` (as ``FrameDocument``)."""

    def __init__(self, opening: int, closing: int):
        self.opening, self.closing = opening, closing

    def __call__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        tokens = np.concatenate([[self.opening], ids, [self.closing]]).astype(np.int32)
        loss_mask = np.ones(tokens.size, np.float32)
        loss_mask[0] = 0.0
        return {"tokens": tokens, "loss_mask": loss_mask}


def shuffle_seed(seed: int) -> int:
    """A 32-bit shuffle seed derived from ``data.seed`` by hashing.

    grain reshuffles epoch ``e`` with seed ``s + e``; hashing keeps neighbouring ``data.seed``
    values from sharing permutations one epoch apart.
    """
    digest = hashlib.blake2b(f"seqmodels.data.shuffle:{seed}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def train_document_stream(documents: Documents, *, seed: int, process_index: int = 0,
                          process_count: int = 1) -> grain.MapDataset:
    """This process's infinite stream of documents: reshuffled every epoch, one in ``process_count``."""
    dataset = grain.MapDataset.source(documents).shuffle(seed=shuffle_seed(seed)).repeat(None)
    return dataset[process_index::process_count]


def text_train_dataset(cfg: DataConfig, *, batch_size: int, process_index: int = 0,
                       process_count: int = 1) -> grain.IterDataset:
    """This process's infinite training batches over the corpus's train documents (module docstring)."""
    split = load_documents(cfg)  # never leaves train empty: a lone document goes to train
    stream = train_document_stream(split.train, seed=cfg.seed, process_index=process_index,
                                   process_count=process_count)
    stream = stream.map(FrameDocument(get_tokenizer(cfg.tokenizer)))
    return pack_and_batch(stream.to_iter_dataset(DOCUMENT_READ_OPTIONS), seq_len=cfg.seq_len,
                          batch_size=batch_size)


def text_eval_batches(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    """Up to ``max_batches`` batches of the held-out sample (``heldout_sample``); ``DataError`` if none is held out."""
    split = load_documents(cfg)
    if not len(split.heldout):
        raise DataError(f"data.heldout_fraction={cfg.heldout_fraction}: no held-out documents "
                        f"among the {len(split.train)} of data.source={cfg.source!r}; "
                        "use a corpus with at least two documents")
    return sampled_heldout_batches(split.heldout, FrameDocument(get_tokenizer(cfg.tokenizer)), seq_len=cfg.seq_len,
                                   batch_size=batch_size, max_batches=max_batches, seed=cfg.heldout_seed)


def tokenizer_vocab_size(cfg: DataConfig) -> int:
    """The vocabulary of ``data.tokenizer``."""
    return get_tokenizer(cfg.tokenizer).vocab_size


def describe_corpus(cfg: DataConfig) -> str:
    """Source, train / held-out document counts, size."""
    return load_documents(cfg).describe()


def corpus_source(documents: Callable[[DataConfig], tuple[Documents, str]],
                  check: Callable[[DataConfig], None] = no_check) -> DataSource:
    """The entry of a document corpus whose documents ``documents(cfg) -> (documents, location)`` lists."""
    return DataSource(train=text_train_dataset, eval=text_eval_batches, vocab_size=tokenizer_vocab_size,
                      describe=describe_corpus, check=check, documents=documents, encodes_text=True)


def require_path(cfg: DataConfig) -> None:
    """The check of the corpora read from ``data.path``."""
    if not cfg.path:
        raise ConfigError(f"data.path: data.source={cfg.source} needs data.path (a glob of files)")
