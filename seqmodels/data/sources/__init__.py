"""The data-source registry: ``data.source`` name -> how to make its batches, its vocabulary, its log line.

Each module of this package registers its sources beside their code
(``register_source("mqar", DataSource(...))`` at its end); ``seqmodels.data.pipeline`` looks the
configured one up. The registry imports every module of this package the first time it is used (a
lookup, a listing, or a registration from outside), so a new source is one new module here::

    text_documents.py  stdlib, text_files, arrayrecord   (a document per file or per shard record)
    record_files.py    jsonl, parquet                    (a document per record's data.text_field)
    token_ids.py       token_ids                         (ArrayRecord shards of token ids, prepare --tokenizer)
    recall.py          mqar, selective_copy              (generated recall examples, data.synthetic)
    needle.py          needle                            (a needle in generated filler text)
    ruler.py           ruler                             (RULER's tasks, data.ruler_tasks)
    cfl.py             cfl                               (context-free-language recognition, seqmodels.data.cfl)

Every batch, training or evaluation, is ``{inputs, targets, segment_ids, positions: int32, loss_mask:
float32}`` with every array ``[batch_size, row_length]`` (``packing.FIELDS``); ``row_length`` is
``data.seq_len`` unless the source documents otherwise (``cfl`` training rows are shorter). Evaluation
batches of a document corpus (text or ``token_ids``) also carry ``documents`` (int32, same shape): the held-out index of each
target token's document, -1 where there is no loss (``seqmodels.data.heldout_sample``).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Sequence
from typing import Protocol

import grain

from seqmodels.config import ConfigError, DataConfig


class TrainBatches(Protocol):
    def __call__(self, cfg: DataConfig, *, batch_size: int, process_index: int,
                 process_count: int) -> grain.IterDataset:
        """This process's endless training batches of ``batch_size`` rows, checkpointable by grain
        (``get_state`` / ``set_state`` continue the same batches). Process ``process_index`` of
        ``process_count`` sees its own share of the stream."""


class EvalBatches(Protocol):
    def __call__(self, cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
        """At most ``max_batches`` held-out batches of exactly ``batch_size`` rows (padding rows have
        ``loss_mask`` 0), deterministic and the same on every process."""


def no_check(cfg: DataConfig) -> None:
    """Nothing to check beyond what ``DataConfig`` checks at load."""


@dataclasses.dataclass(frozen=True)
class DataSource:
    """One value of ``data.source``.

    ``train`` / ``eval``: the batches (``TrainBatches`` / ``EvalBatches``); the arguments are already
    checked by the pipeline. ``vocab_size(cfg)``: the embedding rows the batches need (every token
    id is below it). ``describe(cfg)``: one line for the training log. ``check(cfg)``: raise
    ``ConfigError`` naming the key when the configuration cannot work for this source (the pipeline
    calls it before each of the others). ``documents(cfg) -> (documents, location)``: a document
    corpus's documents (``document_split.Documents``), None for generated sources. ``encodes_text``: the
    batches are text encoded by ``data.tokenizer`` (the tokenizer an export of the run carries).
    """

    train: TrainBatches
    eval: EvalBatches
    vocab_size: Callable[[DataConfig], int]
    describe: Callable[[DataConfig], str]
    check: Callable[[DataConfig], None] = no_check
    documents: Callable[[DataConfig], tuple[Sequence[str], str]] | None = None
    encodes_text: bool = False


_SOURCES: dict[str, DataSource] = {}
_discovery = "pending"  # "running" while this package's modules are imported, then "done"


def _discover() -> None:
    """Import every module of this package once (each registers its sources); a failed import is retried."""
    global _discovery
    if _discovery != "pending":
        return
    _discovery = "running"
    try:
        for module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
            importlib.import_module(f"{__name__}.{module}")
    except BaseException:
        _discovery = "pending"
        raise
    _discovery = "done"


def register_source(name: str, source: DataSource) -> None:
    """Make ``source`` the one ``data.source=name`` picks; a name can be registered once.

    The sources of this package are registered first, so a name they use is refused here.
    """
    if not isinstance(source, DataSource):
        raise TypeError(f"data source {name!r} must be a DataSource, got {type(source).__name__}")
    _discover()
    if name in _SOURCES:
        raise ValueError(f"data source {name!r} is registered twice")
    _SOURCES[name] = source


def source_names() -> tuple[str, ...]:
    """The registered names, sorted."""
    _discover()
    return tuple(sorted(_SOURCES))


def get_source(name: str) -> DataSource:
    """The source registered as ``name``; ``ConfigError`` naming the known ones when there is none."""
    _discover()
    if name not in _SOURCES:
        raise ConfigError(f"data.source: unknown source {name!r}; known sources: {', '.join(source_names())}")
    return _SOURCES[name]
