"""Generated recall tasks: multi-query associative recall (MQAR) and selective copying (``data.synthetic``).

Every example is a ``{"tokens", "loss_mask"}`` element (``packing.py``) of exactly ``seq_len + 1``
tokens, so it fills one row: ``inputs``/``targets`` are its shift and every row holds one example.
Example ``i`` of split ``s`` is a pure function of ``(data.seed, s, task, i)`` (a NumPy ``Generator``
seeded by that tuple): the training stream and the held-out examples never share a seed, and a
resumed run regenerates the same rows. Token ids (``data.synthetic.vocab_size = V``)::

    0 BLANK   1 BOS   2 SEP   keys [3, 3 + n)   values [3 + n, 3 + 2n)   with n = (V - 3) // 2
    selective copying content tokens: [3, V)

**MQAR** (Arora et al., "Zoology", 2023), ``N = num_pairs`` pairs and ``Q = num_queries`` queries::

    BOS k_1 v_1 ... k_N v_N | BLANK ... q_1 a_1 ... BLANK ... q_Q a_Q ... BLANK

keys distinct, values drawn with replacement; each of the Q queries is one of the example's keys
drawn uniformly and independently (with replacement: were every key asked exactly once, the last
answers would follow by elimination, without recall), followed by its value ``a_j``, at random
non-overlapping slots of the region after the pairs (gaps filled with BLANK). Loss (and accuracy)
only on the answers ``a_j``.

**Selective copying** (Gu & Dao, "Mamba", 2023), ``M = num_copy_tokens``::

    BOS | BLANK .. c_1 .. BLANK .. c_M .. BLANK | SEP c_1 ... c_M

the M content tokens at random positions of the region, then copied in order after SEP. Loss
(and accuracy) only on the copy.

Registered sources: ``mqar`` and ``selective_copy``; ``needle.py`` generates the needle task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import grain
import numpy as np

from seqmodels.config import SYNTHETIC_TASKS, DataConfig, SyntheticConfig
from seqmodels.data.packing import pack_and_batch, pad_batch
from seqmodels.data.sources import DataSource, register_source

BLANK_ID, BOS_ID, SEP_ID = 0, 1, 2
FIRST_CONTENT_ID = 3
_TRAIN_STREAM_LENGTH = 2**40  # examples in the (effectively endless) training stream
_SPLITS = {"train": 0, "eval": 1}
# Generating an example takes tens of microseconds: read in the consuming thread. grain's default
# read-ahead threads cost far more than that in polling (and a prefetch thread sits above anyway).
_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _element(tokens: np.ndarray, answers: np.ndarray) -> dict[str, np.ndarray]:
    loss_mask = np.zeros(tokens.size, np.float32)
    loss_mask[answers] = 1.0
    return {"tokens": tokens.astype(np.int32), "loss_mask": loss_mask}


def mqar_example(rng: np.random.Generator, settings: SyntheticConfig, length: int) -> dict[str, np.ndarray]:
    """One MQAR element of ``length`` tokens (module docstring)."""
    pairs, queries = settings.num_pairs, settings.num_queries or settings.num_pairs
    num_keys = (settings.vocab_size - FIRST_CONTENT_ID) // 2
    keys = FIRST_CONTENT_ID + rng.choice(num_keys, size=pairs, replace=False)
    values = FIRST_CONTENT_ID + num_keys + rng.integers(0, num_keys, size=pairs)
    tokens = np.full(length, BLANK_ID, np.int64)
    tokens[0] = BOS_ID
    tokens[1:1 + 2 * pairs:2], tokens[2:2 + 2 * pairs:2] = keys, values
    region_start, region = 1 + 2 * pairs, length - 1 - 2 * pairs
    # Q non-overlapping 2-token slots in the region: sorted distinct offsets in [0, region - Q), shifted.
    starts = region_start + np.sort(rng.choice(region - queries, size=queries, replace=False)) + np.arange(queries)
    asked = rng.integers(0, pairs, size=queries)
    tokens[starts], tokens[starts + 1] = keys[asked], values[asked]
    return _element(tokens, starts + 1)


def selective_copy_example(rng: np.random.Generator, settings: SyntheticConfig,
                           length: int) -> dict[str, np.ndarray]:
    """One selective-copying element of ``length`` tokens (module docstring)."""
    count = settings.num_copy_tokens
    content = rng.integers(FIRST_CONTENT_ID, settings.vocab_size, size=count)
    region = length - 2 - count
    tokens = np.full(length, BLANK_ID, np.int64)
    tokens[0] = BOS_ID
    tokens[1 + np.sort(rng.choice(region, size=count, replace=False))] = content
    tokens[1 + region] = SEP_ID
    tokens[2 + region:] = content
    return _element(tokens, np.arange(2 + region, length))


GENERATORS: dict[str, Callable[[np.random.Generator, SyntheticConfig, int], dict]] = {
    "mqar": mqar_example,
    "selective_copy": selective_copy_example,
}


@dataclasses.dataclass(frozen=True)
class SyntheticExamples(Sequence):
    """A random-access source of ``size`` examples of ``task``: ``examples[i]`` is generated on demand."""

    task: str
    settings: SyntheticConfig
    seq_len: int
    seed: int
    split: str
    size: int

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if not 0 <= index < self.size:
            raise IndexError(f"example {index} outside [0, {self.size})")
        task_id = SYNTHETIC_TASKS.index(self.task)
        rng = np.random.default_rng([self.seed, _SPLITS[self.split], task_id, int(index)])
        return GENERATORS[self.task](rng, self.settings, self.seq_len + 1)


def examples(cfg: DataConfig, split: str, size: int) -> SyntheticExamples:
    """The examples of ``cfg.source`` (a synthetic task) in ``split`` (``train`` or ``eval``)."""
    if cfg.source not in GENERATORS:
        raise ValueError(f"data.source={cfg.source!r} is not a synthetic task ({', '.join(GENERATORS)})")
    return SyntheticExamples(cfg.source, cfg.synthetic, cfg.seq_len, cfg.seed, split, size)


def make_synthetic_train_dataset(cfg: DataConfig, *, batch_size: int, process_index: int = 0,
                                 process_count: int = 1) -> grain.IterDataset:
    """Endless training batches of the task; process ``p`` takes examples ``p, p + P, p + 2P, ...``."""
    source = grain.MapDataset.source(examples(cfg, "train", _TRAIN_STREAM_LENGTH))
    stream = source[process_index::process_count].to_iter_dataset(_READ_OPTIONS)
    return pack_and_batch(stream, seq_len=cfg.seq_len, batch_size=batch_size)


def make_synthetic_eval_batches(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    """``max_batches`` batches of held-out examples (seeds disjoint from training); the same on every process."""
    source = grain.MapDataset.source(examples(cfg, "eval", batch_size * max_batches))
    stream = source.to_iter_dataset(_READ_OPTIONS)
    batches = pack_and_batch(stream, seq_len=cfg.seq_len, batch_size=batch_size, drop_remainder=False)
    return [pad_batch(batch, batch_size) for batch in batches]


def describe_synthetic(cfg: DataConfig) -> str:
    """One line for the training log."""
    settings = cfg.synthetic
    if cfg.source == "mqar":
        what = f"{settings.num_pairs} key-value pairs, {settings.num_queries or settings.num_pairs} queries"
    else:
        what = f"{settings.num_copy_tokens} tokens to copy"
    return (f"data.source={cfg.source}: {what} per row of {cfg.seq_len} tokens, "
            f"vocabulary {settings.vocab_size}, seed {cfg.seed}")


def synthetic_vocab_size(cfg: DataConfig) -> int:
    """``data.synthetic.vocab_size``: the ids the recall tasks use."""
    return cfg.synthetic.vocab_size


for _task in GENERATORS:
    register_source(_task, DataSource(train=make_synthetic_train_dataset, eval=make_synthetic_eval_batches,
                                      vocab_size=synthetic_vocab_size, describe=describe_synthetic))
