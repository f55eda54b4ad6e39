"""CFL recognition examples as token rows: the vocabulary, training batches, evaluation batches.

One labelled string ``w`` of ``language`` is the element ``[BOS_language] w_1 .. w_N [CLS] [LABEL]``
with ``LABEL`` = ``<accept>`` or ``<reject>`` and a loss only on ``LABEL``; one element fills the
front of one row (the rest is empty: token 0, segment 0) and is shifted
like a packed row (``packing.shift_row``, but the label is never an input), so a batch has the usual
fields::

    inputs      [BOS] w_1 .. w_N [CLS]  0 ...         (N + 2 tokens, then empty)
    targets     w_1 .. w_N [CLS] [LABEL] 0 ...        (the label is the target at the [CLS] position)
    loss_mask   0 ... 0 1 0 ...                       (1 at the [CLS] position only)
    segment_ids 1 ... 1 0 ...   positions 0 1 ... N+1 0 ...

A language model can train on these rows as they are (predict the token after [CLS]); the looped
model reads N from the segment, inserts its padding before [CLS] and reads out at [CLS].
Each language has its own [BOS] token, so one model can learn several languages.

Training batches are a deterministic function of ``(data.seed, batch index)`` (``CflTrainBatches``):
a batch draws one of ``data.cfl.length_buckets`` length ranges, each example a language, a length
in that range with positives, and a class by a fair coin. Rows are as long as the range needs, so
a batch of short strings costs less. The grain iterator state is the batch index, so resuming
continues the same stream.
"""

from __future__ import annotations

import dataclasses
import random

import grain
import numpy as np

from seqmodels.config import CflDataConfig, ConfigError, DataConfig
from seqmodels.data.cfl import LANGUAGES, check_language, sample, sample_string, valid_lengths
from seqmodels.data.cfl_recognisers import RECOGNISERS
from seqmodels.data.sources import DataSource, register_source
from seqmodels.special_tokens import ACCEPT_ID, CFL_FIXED_IDS, CLS_ID, EMPTY_ID, PAD_ID, REJECT_ID  # noqa: F401

BOS_IDS = {name: CFL_FIXED_IDS + i for i, name in enumerate(LANGUAGES)}
SYMBOLS = "()[]ab#cd01&|!"
SYMBOL_IDS = {symbol: CFL_FIXED_IDS + len(BOS_IDS) + i for i, symbol in enumerate(SYMBOLS)}
VOCAB_SIZE = CFL_FIXED_IDS + len(BOS_IDS) + len(SYMBOLS)

_STREAM_LENGTH = 2**40  # examples per epoch of the (effectively endless) training stream


def encode(language: str, text: str) -> np.ndarray:
    """``[BOS_language] w_1 .. w_N [CLS]`` as int32 ids ``[N + 2]``."""
    check_language(language)
    unknown = sorted(set(text) - set(LANGUAGES[language].alphabet))
    if unknown:
        raise ValueError(f"text has symbols {unknown} outside the {language} alphabet "
                         f"{LANGUAGES[language].alphabet!r}")
    return np.array([BOS_IDS[language], *(SYMBOL_IDS[s] for s in text), CLS_ID], np.int32)


def decode(tokens) -> tuple[str, str]:
    """``(language, text)`` of ``[BOS_language] w_1 .. w_N [CLS]`` (what ``encode`` made)."""
    tokens = [int(t) for t in tokens]
    languages = {bos: name for name, bos in BOS_IDS.items()}
    symbols = {i: symbol for symbol, i in SYMBOL_IDS.items()}
    if len(tokens) < 2 or tokens[0] not in languages or tokens[-1] != CLS_ID:
        raise ValueError(f"tokens must be [BOS_language] symbols... [CLS], got {tokens}")
    if any(t not in symbols for t in tokens[1:-1]):
        raise ValueError(f"tokens between [BOS] and [CLS] must be symbols, got {tokens[1:-1]}")
    return languages[tokens[0]], "".join(symbols[t] for t in tokens[1:-1])


def labelled_element(language: str, text: str, label: bool) -> dict[str, np.ndarray]:
    """The element ``[BOS] w [CLS] [LABEL]`` with its loss on ``LABEL`` only."""
    tokens = np.append(encode(language, text), ACCEPT_ID if label else REJECT_ID).astype(np.int32)
    loss_mask = np.zeros(tokens.size, np.float32)
    loss_mask[-1] = 1.0
    return {"tokens": tokens, "loss_mask": loss_mask}


def element_to_example(element: dict[str, np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
    """The batch fields ``[seq_len]`` of one element at the front of an otherwise empty row.

    As ``packing.shift_row`` of that row, except that the label never appears among the inputs:
    the segment covers exactly ``[BOS] w [CLS]``.
    """
    tokens, loss_mask = element["tokens"], element["loss_mask"]
    size = tokens.size - 1
    if size > seq_len:
        raise ValueError(f"an example of {size - 2} symbols needs seq_len >= {size}, got {seq_len}")
    example = {"inputs": np.zeros(seq_len, np.int32), "targets": np.zeros(seq_len, np.int32),
               "segment_ids": np.zeros(seq_len, np.int32), "positions": np.zeros(seq_len, np.int32),
               "loss_mask": np.zeros(seq_len, np.float32)}
    example["inputs"][:size] = tokens[:-1]
    example["targets"][:size] = tokens[1:]
    example["loss_mask"][:size] = loss_mask[1:]
    example["segment_ids"][:size] = 1
    example["positions"][:size] = np.arange(size)
    return example


def labelled_batch(language: str, examples, seq_len: int | None = None) -> dict[str, np.ndarray]:
    """Batch fields ``[len(examples), seq_len]`` for ``[(text, label), ...]`` (default seq_len: longest + 2)."""
    if not examples:
        raise ValueError("examples must hold at least one (text, label) pair")
    seq_len = seq_len or max(len(text) for text, _ in examples) + 2
    rows = [element_to_example(labelled_element(language, text, label), seq_len) for text, label in examples]
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


def check_cfl_config(cfg: DataConfig) -> None:
    """Every language must have positive strings at some length in ``[min_length, max_length]``."""
    for language in cfg.cfl.languages:
        if not valid_lengths(language, cfg.cfl.min_length, cfg.cfl.max_length):
            raise ConfigError(f"data.cfl.languages: {language} has no positive string of a length in "
                              f"[data.cfl.min_length={cfg.cfl.min_length}, data.cfl.max_length="
                              f"{cfg.cfl.max_length}]; it has positives at {LANGUAGES[language].describe_lengths()}")


def length_buckets(cfl: CflDataConfig) -> list[tuple[int, int]]:
    """``[min_length, max_length]`` cut into ``cfl.length_buckets`` near-equal ranges ``(low, high)``,
    keeping those where some language of ``cfl.languages`` has positives."""
    span = cfl.max_length - cfl.min_length + 1
    count = min(cfl.length_buckets, span)
    edges = [cfl.min_length + (span * k) // count for k in range(count + 1)]
    ranges = [(edges[k], edges[k + 1] - 1) for k in range(count)]
    return [(low, high) for low, high in ranges
            if any(valid_lengths(language, low, high) for language in cfl.languages)]


def draw_element(cfl: CflDataConfig, seed: int, stream: str, index: int, low: int, high: int) -> dict:
    """Example ``index`` of ``stream``: a uniform language (among those with positives in ``[low, high]``),
    a uniform length there, a fair coin for the class; deterministic in ``(seed, stream, index)``."""
    rng = random.Random(f"seqmodels.cfl.{stream}:{seed}:{index}")
    language = rng.choice([name for name in cfl.languages if valid_lengths(name, low, high)])
    length = rng.choice(valid_lengths(language, low, high))
    text = sample_string(LANGUAGES[language], length, rng.random() < 0.5, rng)
    return labelled_element(language, text, RECOGNISERS[language](text))


def stack_rows(rows: list[dict]) -> dict[str, np.ndarray]:
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


@dataclasses.dataclass(frozen=True)
class CflTrainBatches:
    """Random-access source of this process's rows of global training batch ``b``.

    Batch ``b`` draws one length range from ``length_buckets`` (weighted by its width; with a
    curriculum, among the ranges open at ``b``: range k opens at ``b = k * curriculum_steps / K``) and
    fills ``global_rows`` rows with examples ``b * global_rows + r`` of lengths in that range; its rows
    are ``high + 2`` tokens long (the last range: ``seq_len``), so short strings cost short rows.
    """

    data: DataConfig
    global_rows: int
    process_index: int
    process_count: int

    def __len__(self) -> int:
        return _STREAM_LENGTH

    def __getitem__(self, batch_index: int) -> dict[str, np.ndarray]:
        cfl, seed = self.data.cfl, self.data.seed
        buckets = length_buckets(cfl)
        longest = buckets[-1][1]
        if cfl.curriculum_steps:
            buckets = buckets[:1 + batch_index * len(buckets) // cfl.curriculum_steps]
        rng = random.Random(f"seqmodels.cfl.train-bucket:{seed}:{batch_index}")
        low, high = rng.choices(buckets, weights=[high - low + 1 for low, high in buckets])[0]
        row_length = self.data.seq_len if high == longest else high + 2
        rows = self.global_rows // self.process_count
        first = batch_index * self.global_rows + self.process_index * rows
        return stack_rows([element_to_example(draw_element(cfl, seed, "train", index, low, high), row_length)
                           for index in range(first, first + rows)])


def make_cfl_train_dataset(cfg: DataConfig, *, batch_size: int, process_index: int = 0,
                           process_count: int = 1) -> grain.IterDataset:
    """This process's endless training batches ``{field: [batch_size, row_length]}`` (see ``CflTrainBatches``)."""
    check_cfl_config(cfg)
    source = CflTrainBatches(cfg, batch_size * process_count, process_index, process_count)
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)  # generation holds the GIL
    return grain.MapDataset.source(source).to_iter_dataset(read_options)


def make_cfl_eval_batches(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    """``max_batches`` batches of rows of ``seq_len`` from a held-out stream (its own seed namespace)."""
    check_cfl_config(cfg)
    low, high = cfg.cfl.min_length, cfg.cfl.max_length
    return [stack_rows([element_to_example(draw_element(cfg.cfl, cfg.seed, "heldout", index, low, high), cfg.seq_len)
                        for index in range(start, start + batch_size)])
            for start in range(0, batch_size * max_batches, batch_size)]


def describe_cfl(cfg: DataConfig) -> str:
    return (f"cfl languages {list(cfg.cfl.languages)}, lengths {cfg.cfl.min_length}..{cfg.cfl.max_length}, "
            f"seed {cfg.seed}")


def evaluation_set(language: str, length: int, num: int, seed: int) -> dict[str, np.ndarray]:
    """``sample(language, num, length, seed)`` as one batch of rows of exactly ``length + 2`` tokens."""
    return labelled_batch(language, sample(language, num, length, seed), seq_len=length + 2)


def cfl_vocab_size(cfg: DataConfig) -> int:
    """``VOCAB_SIZE``: the fixed ids, one [BOS] per language, the symbols."""
    return VOCAB_SIZE


register_source("cfl", DataSource(train=make_cfl_train_dataset, eval=make_cfl_eval_batches, vocab_size=cfl_vocab_size,
                                  describe=describe_cfl, check=check_cfl_config))
