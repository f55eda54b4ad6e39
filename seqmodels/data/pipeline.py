"""grain pipelines of the configured data source: training batches, evaluation batches, a log line.

``data.source`` names an entry of the source registry (``sources/``); these functions check the
shared arguments, look the entry up (and run its ``check``), and call it. The sources and their row
layouts: ``document_rows.py`` (document corpora packed into rows: ``sources/text_documents.py``,
``record_files.py``, ``token_ids.py``), ``sources/recall.py`` (MQAR, selective copying),
``sources/needle.py``, and ``sources/cfl.py`` (context-free-language recognition, ``cfl/``).

Each batch is ``{inputs, targets, segment_ids, positions: int32, loss_mask: float32}``, every
array ``[batch_size, seq_len]``; with ``process_index`` / ``process_count`` a process draws only its
share of the documents (``batch_size`` rows of its own), which then depends on the process count:
training instead draws the global batch on every process. ``packing.py`` defines the fields exactly.

The training iterator is a ``grain.DatasetIterator``: ``get_state()`` is a small JSON-safe dict and
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

grain writes one JSON file per process (``process_<i>-of-<n>.json``). Training draws the global
batch on every process (``batch_size`` = the global batch) and keeps each process's rows
(``seqmodels.training.batches``), so the files hold one position, which any number of processes
continues. The state is read when ``save`` is called, also with asynchronous saving.
"""

from __future__ import annotations

import grain

from seqmodels.config import DataConfig
from seqmodels.data.sources import DataSource, get_source
from seqmodels.data.document_rows import FrameDocument, shuffle_seed, train_document_stream  # noqa: F401  (re-exported)


def _check_batching(batch_size: int, process_index: int, process_count: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(process_count, int) or process_count < 1:
        raise ValueError(f"process_count must be an int >= 1, got {process_count!r}")
    if not isinstance(process_index, int) or not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be an int in [0, {process_count}), "
                         f"got {process_index!r}")


def _source(cfg: DataConfig) -> DataSource:
    """The registered entry of ``cfg.source``, its own checks passed (``ConfigError`` otherwise)."""
    source = get_source(cfg.source)
    source.check(cfg)
    return source


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
    batches = _source(cfg).train(cfg, batch_size=batch_size, process_index=process_index,
                                 process_count=process_count)
    if prefetch_batches:
        batches = grain.experimental.ThreadPrefetchIterDataset(batches, prefetch_buffer_size=prefetch_batches)
    return batches


def make_eval_batches(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    """Up to ``max_batches`` held-out batches, one pass, deterministic and the same on every process.

    The last batch is padded to ``batch_size`` rows with all-zero rows (``loss_mask`` 0). A document
    corpus raises ``DataError`` when no document is held out.
    """
    _check_batching(batch_size, 0, 1)
    if not isinstance(max_batches, int) or max_batches < 1:
        raise ValueError(f"max_batches must be an int >= 1, got {max_batches!r}")
    return _source(cfg).eval(cfg, batch_size=batch_size, max_batches=max_batches)


def required_vocab_size(cfg: DataConfig) -> int:
    """The embedding rows a model needs for this data: the tokenizer's vocabulary, or a generated task's own."""
    return _source(cfg).vocab_size(cfg)


def describe_source(cfg: DataConfig) -> str:
    """One line for the training log (a corpus: source, train / held-out document counts, size)."""
    return _source(cfg).describe(cfg)
