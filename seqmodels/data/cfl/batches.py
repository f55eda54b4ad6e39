"""CFL recognition batches: the training stream and the held-out evaluation batches of ``data.source=cfl``.

Training batches are a deterministic function of ``(data.seed, batch index)`` (``CflTrainBatches``):
a batch draws one of ``data.cfl.length_buckets`` length ranges, each example a language, a length
in that range with positives, and a class by a fair coin. Rows are as long as the range needs, so
a batch of short strings costs less. The grain iterator state is the batch index, so resuming
continues the same stream.

Each row is ``rows.element_to_example`` of one labelled string (``rows.py`` shows the layout).
"""

from __future__ import annotations

import dataclasses
import random

import grain
import numpy as np

from seqmodels.config import CflDataConfig, ConfigError, DataConfig
from seqmodels.data.cfl.languages import LANGUAGES, sample_string, valid_lengths
from seqmodels.data.cfl.recognisers import RECOGNISERS
from seqmodels.data.cfl.rows import element_to_example, labelled_element, stack_rows

_STREAM_LENGTH = 2**40  # examples per epoch of the (effectively endless) training stream


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
