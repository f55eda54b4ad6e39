"""grain pipelines over a text corpus: training batches, evaluation batches, a log line.

Training (``make_train_dataset``)::

    train documents (corpus.load_documents)
      -> shuffle by data.seed, a new permutation each epoch, repeated forever    (MapDataset)
      -> global stream index i goes to process i % process_count                 (MapDataset slice)
      -> tokenize: [BOS] + UTF-8 bytes + [EOS], loss on every token but BOS
      -> pack into rows of seq_len + 1 tokens, documents continuing across rows  (packing.py)
      -> shift into inputs / targets, batch                                      (IterDataset)

Each batch is ``{inputs, targets, segment_ids, positions: int32, loss_mask: float32}``, every
array ``[batch_size, seq_len]``; ``batch_size`` is the rows of *this process* (the global batch
divided by ``process_count``). ``packing.py`` defines the fields exactly.

The iterator is a ``grain.DatasetIterator``: ``get_state()`` is a small JSON-safe dict and
``set_state(state)`` on a fresh iterator of the same configuration continues the same batches,
bitwise. With an orbax ``CheckpointManager`` the state is saved next to the train state::

    import grain, orbax.checkpoint as ocp
    iterator = iter(make_train_dataset(cfg.data, batch_size=rows_per_process))
    manager = ocp.CheckpointManager(run_dir, options=ocp.CheckpointManagerOptions(max_to_keep=3))
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state),
        data=grain.checkpoint.CheckpointSave(iterator)))
    # on resume, with a fresh iterator built from the same config:
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_train_state),
        data=grain.checkpoint.CheckpointRestore(iterator)))
    # `iterator` (also restored["data"]) now continues where the saved one stood.

grain writes one JSON file per process (``process_<i>-of-<n>.json``), so every process restores
its own position. The state is read when ``save`` is called, also with asynchronous saving.

Generated tasks (``data.source`` = ``mqar`` | ``selective_copy``) come from ``synthetic.py``: one
example per row, a pure function of the seed and the example's index, the same batch format.
"""

from __future__ import annotations

import dataclasses
import hashlib

import grain
import numpy as np

from seqmodels.config import DataConfig
from seqmodels.data import synthetic
from seqmodels.data.cfl_pipeline import VOCAB_SIZE as CFL_VOCAB_SIZE
from seqmodels.data.cfl_pipeline import (check_cfl_config, describe_cfl, make_cfl_eval_batches,
                                         make_cfl_train_dataset)
from seqmodels.data.corpus import DataError, Documents, load_documents
from seqmodels.data.packing import pack_and_batch, pad_batch
from seqmodels.data.synthetic import (GENERATORS, describe_synthetic, make_synthetic_eval_batches,
                                      make_synthetic_train_dataset)
from seqmodels.data.tokenizers import ByteTokenizer, get_tokenizer

# Documents are read and tokenized ahead of the packer by a few threads; one document fills tens of
# rows on average, so a short buffer keeps the packer fed without reading far ahead.
_READ_OPTIONS = grain.ReadOptions(num_threads=4, prefetch_buffer_size=16)


@dataclasses.dataclass(frozen=True)
class FrameDocument:
    """text -> ``{"tokens": [BOS] + bytes + [EOS], "loss_mask": [0, 1, ..., 1]}`` (int32, float32)."""

    tokenizer: ByteTokenizer

    def __call__(self, text: str) -> dict[str, np.ndarray]:
        body = self.tokenizer.encode(text)
        tokens = np.empty(body.size + 2, np.int32)
        tokens[0], tokens[1:-1], tokens[-1] = self.tokenizer.bos_id, body, self.tokenizer.eos_id
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


def _check_batching(batch_size: int, process_index: int, process_count: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(process_count, int) or process_count < 1:
        raise ValueError(f"process_count must be an int >= 1, got {process_count!r}")
    if not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be an int in [0, {process_count}), "
                         f"got {process_index!r}")


def train_document_stream(documents: Documents, *, seed: int, process_index: int = 0,
                          process_count: int = 1) -> grain.MapDataset:
    """This process's infinite stream of documents: reshuffled every epoch, one in ``process_count``."""
    dataset = grain.MapDataset.source(documents).shuffle(seed=shuffle_seed(seed)).repeat(None)
    return dataset[process_index::process_count]


def make_train_dataset(cfg: DataConfig, *, batch_size: int, process_index: int = 0,
                       process_count: int = 1, prefetch_batches: int = 0) -> grain.IterDataset:
    """The infinite training batches of one process (see the module docstring).

    ``process_index`` / ``process_count`` are ``jax.process_index()`` / ``jax.process_count()``
    in a multi-host run (grain's checkpoint handler names each state file by them).
    ``prefetch_batches`` > 0 prepares that many batches ahead in a background thread; the saved
    state still points at the next batch the caller receives, so resuming stays exact.
    """
    _check_batching(batch_size, process_index, process_count)
    if not isinstance(prefetch_batches, int) or prefetch_batches < 0:
        raise ValueError(f"prefetch_batches must be an int >= 0, got {prefetch_batches!r}")
    if cfg.source == "needle":
        batches = synthetic.needle_train_dataset(cfg, batch_size=batch_size, process_index=process_index,
                                                 process_count=process_count)
        return _prefetched(batches, prefetch_batches)
    if cfg.source in GENERATORS:
        batches = make_synthetic_train_dataset(cfg, batch_size=batch_size, process_index=process_index,
                                               process_count=process_count)
        return _prefetched(batches, prefetch_batches)
    if cfg.source == "cfl":
        batches = make_cfl_train_dataset(cfg, batch_size=batch_size, process_index=process_index,
                                         process_count=process_count)
        return _prefetched(batches, prefetch_batches)
    split = load_documents(cfg)  # never leaves train empty: a lone document goes to train
    stream = train_document_stream(split.train, seed=cfg.seed, process_index=process_index,
                                   process_count=process_count)
    stream = stream.map(FrameDocument(get_tokenizer(cfg.tokenizer)))
    batches = pack_and_batch(stream.to_iter_dataset(_READ_OPTIONS), seq_len=cfg.seq_len,
                             batch_size=batch_size)
    return _prefetched(batches, prefetch_batches)


def _prefetched(batches: grain.IterDataset, prefetch_batches: int) -> grain.IterDataset:
    if prefetch_batches:
        batches = grain.experimental.ThreadPrefetchIterDataset(
            batches, prefetch_buffer_size=prefetch_batches)
    return batches


def make_eval_batches(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    """Up to ``max_batches`` batches over the held-out documents in corpus order, one pass.

    Deterministic (no shuffle, no repeat) and the same on every process. The last batch is padded
    to ``batch_size`` rows with all-zero rows (``loss_mask`` 0). Raises ``DataError`` when no
    document is held out.
    """
    _check_batching(batch_size, 0, 1)
    if not isinstance(max_batches, int) or max_batches < 1:
        raise ValueError(f"max_batches must be an int >= 1, got {max_batches!r}")
    if cfg.source == "needle":
        return synthetic.needle_eval_batches(cfg, batch_size=batch_size, max_batches=max_batches)
    if cfg.source in GENERATORS:
        return make_synthetic_eval_batches(cfg, batch_size=batch_size, max_batches=max_batches)
    if cfg.source == "cfl":
        return make_cfl_eval_batches(cfg, batch_size=batch_size, max_batches=max_batches)
    split = load_documents(cfg)
    if not len(split.heldout):
        raise DataError(f"data.heldout_fraction={cfg.heldout_fraction}: no held-out documents "
                        f"among the {len(split.train)} of data.source={cfg.source!r}; "
                        "use a corpus with at least two documents")
    stream = grain.MapDataset.source(split.heldout).map(FrameDocument(get_tokenizer(cfg.tokenizer)))
    batches = pack_and_batch(stream.to_iter_dataset(_READ_OPTIONS), seq_len=cfg.seq_len,
                             batch_size=batch_size, drop_remainder=False)
    result = []
    for batch in batches:
        result.append(pad_batch(batch, batch_size))
        if len(result) == max_batches:
            break
    return result


def required_vocab_size(cfg: DataConfig) -> int:
    """The embedding rows a model needs for this data: the tokenizer's vocabulary (synthetic tasks: their own)."""
    if cfg.source in GENERATORS:
        return cfg.synthetic.vocab_size
    """The embedding rows a model needs for this data: the tokenizer's vocabulary (cfl: its own)."""
    if cfg.source == "cfl":
        check_cfl_config(cfg)
        return CFL_VOCAB_SIZE
    return get_tokenizer(cfg.tokenizer).vocab_size


def describe_source(cfg: DataConfig) -> str:
    """One line for the training log: source, train / held-out document counts, size."""
    if cfg.source == "needle":
        return synthetic.describe_needle(cfg)
    if cfg.source in GENERATORS:
        return describe_synthetic(cfg)
    if cfg.source == "cfl":
        return describe_cfl(cfg)
    return load_documents(cfg).describe()
