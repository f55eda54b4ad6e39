"""Generated tasks as grain sources: multi-query associative recall (MQAR), selective copying, needle.

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

Needle in a haystack (``data.source = needle``)
-----------------------------------------------

A row of exactly ``n`` byte tokens::

    [BOS] filler ... " #KK=VV." ... filler " #KK=" VV
          `--- depth d of the haystack ---'  `query' `answer

The haystack is lowercase filler words (no digits, ``#`` or ``=``); the needle ``" #KK=VV."``
(``KK``: ``needle_key_length`` random digits, ``VV``: ``needle_value_length`` random digits) is
inserted after the first ``round(d * len(filler))`` filler bytes, so ``d`` in [0, 1] is the
fraction of the haystack before it. ``needle_distractors`` more needles with other keys sit at
uniformly random depths. The row ends with the query ``" #KK="`` and the answer ``VV``; only the
answer carries loss (``loss_mask`` 1 on the value bytes). Training rows have ``n = seq_len + 1``
tokens (one row per example, depths uniform in [0, 1]); evaluation builds prompts of any length
and scores the model's greedy continuation (``seqmodels.evaluation.needle``), so a model trained
at one length can be tested at 2x and 4x that length.

Example ``i`` of a stream seeded ``s`` is drawn from ``numpy.random.default_rng([s, i])``;
evaluation sets use ``[s, EVAL_SALT, length, j, i]``, never a training seed sequence.

Registered sources (``sources.py``): ``mqar``, ``selective_copy`` and ``needle``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import grain
import numpy as np

from seqmodels.config import SYNTHETIC_TASKS, DataConfig, SyntheticConfig, needle_min_length
from seqmodels.data.corpus import DataError
from seqmodels.data.packing import pack_and_batch, pad_batch
from seqmodels.data.sources import DataSource, register_source
from seqmodels.data.tokenizers import BOS_ID as BYTE_BOS_ID
from seqmodels.data.tokenizers import ByteTokenizer

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


# Needle in a haystack (byte tokens; module docstring).

NEEDLE_FILLER_WORDS = (
    "the", "a", "river", "stone", "over", "under", "quiet", "green", "field", "light", "morning", "walks",
    "slowly", "past", "old", "house", "with", "many", "windows", "and", "small", "garden", "where", "birds",
    "sing", "in", "warm", "air", "while", "clouds", "drift", "above", "hills", "far", "away", "from", "town",
    "people", "talk", "about", "weather", "news", "bread", "market", "evening", "road", "bridge", "water",
)
EVAL_SALT = 7_919_041
_TOKENIZER = ByteTokenizer()


@dataclasses.dataclass(frozen=True)
class NeedleExample:
    """``prompt``: int32 tokens up to and including the query; ``answer``: the value's tokens."""

    prompt: np.ndarray
    answer: np.ndarray
    depth: float


def _digits(rng: np.random.Generator, count: int) -> str:
    return "".join(str(d) for d in rng.integers(0, 10, count))


def _filler(rng: np.random.Generator, num_bytes: int) -> str:
    words = rng.choice(len(NEEDLE_FILLER_WORDS), size=num_bytes // 2 + 1)
    return " ".join(NEEDLE_FILLER_WORDS[w] for w in words)[:num_bytes]


def _keys(rng: np.random.Generator, key_length: int, count: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < count:
        key = _digits(rng, key_length)
        if key not in keys:
            keys.append(key)
    return keys


def make_needle_example(rng: np.random.Generator, length: int, depth: float, *, key_length: int = 2,
                        value_length: int = 2, distractors: int = 0) -> NeedleExample:
    """One example of ``length`` tokens in all (prompt + answer) with the needle at ``depth``."""
    shortest = needle_min_length(key_length, value_length, distractors)
    if length < shortest:
        raise ValueError(f"length must be >= {shortest} for key_length={key_length}, value_length={value_length}, "
                         f"distractors={distractors}; got {length}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    keys = _keys(rng, key_length, 1 + distractors)
    values = [_digits(rng, value_length) for _ in keys]
    needles = [f" #{key}={value}." for key, value in zip(keys, values)]
    query = f" #{keys[0]}="
    filler = _filler(rng, length - 1 - sum(map(len, needles)) - len(query) - value_length)
    cuts = [round(depth * len(filler))] + [int(c) for c in rng.integers(0, len(filler) + 1, distractors)]
    order = sorted(range(len(cuts)), key=lambda i: (cuts[i], i))
    pieces, previous = [], 0
    for i in order:
        pieces += [filler[previous:cuts[i]], needles[i]]
        previous = cuts[i]
    text = "".join(pieces) + filler[previous:] + query
    prompt = np.concatenate([[BYTE_BOS_ID], _TOKENIZER.encode(text)]).astype(np.int32)
    return NeedleExample(prompt, _TOKENIZER.encode(values[0]), float(depth))


def needle_element(example: NeedleExample) -> dict[str, np.ndarray]:
    """A packable element: ``tokens = prompt + answer``, loss on the answer only."""
    tokens = np.concatenate([example.prompt, example.answer]).astype(np.int32)
    loss_mask = np.zeros(tokens.size, np.float32)
    loss_mask[example.prompt.size:] = 1.0
    return {"tokens": tokens, "loss_mask": loss_mask}


@dataclasses.dataclass(frozen=True)
class _TrainingNeedle:
    """Index ``i`` -> the training element seeded ``[seed, i]`` (a picklable map for grain)."""

    cfg: DataConfig

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.cfg.seed, int(index)])
        depth = float(rng.uniform(0.0, 1.0))
        return needle_element(make_needle_example(
            rng, self.cfg.seq_len + 1, depth, key_length=self.cfg.needle_key_length,
            value_length=self.cfg.needle_value_length, distractors=self.cfg.needle_distractors))


def needle_train_dataset(cfg: DataConfig, *, batch_size: int, process_index: int = 0,
                         process_count: int = 1) -> grain.IterDataset:
    """Infinite training batches of needle rows (one example per row), checkpointable by grain."""
    if cfg.source != "needle":
        raise DataError(f"data.source must be needle for needle batches, got {cfg.source!r}")
    indices = grain.MapDataset.range(0, 2**62)[process_index::process_count]
    stream = indices.map(_TrainingNeedle(cfg)).to_iter_dataset()
    return pack_and_batch(stream, seq_len=cfg.seq_len, batch_size=batch_size)


def needle_eval_examples(length: int, depths, per_depth: int, *, seed: int, key_length: int = 2,
                         value_length: int = 2, distractors: int = 0) -> list[NeedleExample]:
    """``per_depth`` examples of ``length`` tokens at each depth in ``depths`` (evaluation seeds)."""
    if per_depth < 1:
        raise ValueError(f"per_depth must be >= 1, got {per_depth}")
    return [make_needle_example(np.random.default_rng([seed, EVAL_SALT, length, j, i]), length, float(depth),
                                key_length=key_length, value_length=value_length, distractors=distractors)
            for j, depth in enumerate(depths) for i in range(per_depth)]


def needle_eval_batches(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    """Held-out needle rows at ``seq_len`` (depths evenly spaced), batched like ``make_eval_batches``."""
    count = batch_size * max_batches
    depths = np.linspace(0.0, 1.0, count)
    examples = [make_needle_example(np.random.default_rng([cfg.seed, EVAL_SALT, i]), cfg.seq_len + 1, float(d),
                                    key_length=cfg.needle_key_length, value_length=cfg.needle_value_length,
                                    distractors=cfg.needle_distractors) for i, d in enumerate(depths)]
    stream = grain.MapDataset.source([needle_element(e) for e in examples]).to_iter_dataset()
    batches = pack_and_batch(stream, seq_len=cfg.seq_len, batch_size=batch_size, drop_remainder=False)
    return [pad_batch(batch, batch_size) for batch in batches]


def describe_needle(cfg: DataConfig) -> str:
    """One log line for ``data.source = needle``."""
    return (f"needle-in-a-haystack rows of {cfg.seq_len + 1} tokens (keys of {cfg.needle_key_length} digits, "
            f"values of {cfg.needle_value_length}, {cfg.needle_distractors} distractors), seed {cfg.seed}")


def synthetic_vocab_size(cfg: DataConfig) -> int:
    """``data.synthetic.vocab_size``: the ids the recall tasks use."""
    return cfg.synthetic.vocab_size


def needle_vocab_size(cfg: DataConfig) -> int:
    """Needle rows are byte tokens (``ByteTokenizer``, begin- and end-of-document ids included)."""
    return _TOKENIZER.vocab_size


for _task in GENERATORS:
    register_source(_task, DataSource(train=make_synthetic_train_dataset, eval=make_synthetic_eval_batches,
                                      vocab_size=synthetic_vocab_size, describe=describe_synthetic))
register_source("needle", DataSource(train=needle_train_dataset, eval=needle_eval_batches,
                                     vocab_size=needle_vocab_size, describe=describe_needle))
