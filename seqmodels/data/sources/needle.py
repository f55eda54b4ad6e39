"""Needle in a haystack: the source ``needle``, and the examples of the needle evaluation.

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
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from seqmodels.config import DataConfig, needle_min_length
from seqmodels.data.errors import DataError
from seqmodels.data.packing import pack_and_batch, pad_batch
from seqmodels.data.sources import DataSource, register_source
from seqmodels.data.tokenizers import BOS_ID, ByteTokenizer

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
    prompt = np.concatenate([[BOS_ID], _TOKENIZER.encode(text)]).astype(np.int32)
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


def needle_vocab_size(cfg: DataConfig) -> int:
    """Needle rows are byte tokens (``ByteTokenizer``, begin- and end-of-document ids included)."""
    return _TOKENIZER.vocab_size


register_source("needle", DataSource(train=needle_train_dataset, eval=needle_eval_batches,
                                     vocab_size=needle_vocab_size, describe=describe_needle))
