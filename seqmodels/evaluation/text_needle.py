"""Needle in a haystack of real text: retrieve a number stated once, deep in held-out documents.

Each example is one row of ``length`` tokens of the run's own tokenizer::

    [open] haystack[:a]  NEEDLE  haystack[a:b]  QUERY  ANSWER

with ``NEEDLE`` = ``" The secret number is {v}."``, ``QUERY`` = ``" What is the secret number? The secret
number is"`` and ``ANSWER`` = the tokens of ``" {v}"`` (``v`` a random 4-digit number); the haystack is the
run's held-out documents (``data.heldout_path`` or the hash split), tokenized and concatenated with
their end-of-document tokens, taken from a random offset; ``a`` puts the needle at fraction ``depth`` of
the haystack. An example counts as retrieved iff the model's argmax at every answer position is the
answer token, given the answer tokens before it: exactly the condition under which greedy decoding
after ``QUERY`` produces ``ANSWER``, computed in one forward pass (no decoding cache, so every mixer is
scored the same way). Departure from the usual needle test: the haystack is real held-out text, not
repeated filler, so the test also measures whether a model trained on that text can find a fact in it.
"""

from __future__ import annotations

from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seqmodels.data.document_split import load_documents
from seqmodels.data.tokenizers import get_tokenizer
from seqmodels.evaluation.intervals import bootstrap_interval

NEEDLE = " The secret number is {value}."
QUERY = " What is the secret number? The secret number is"


@nnx.jit
def _argmax(model, inputs, segment_ids, positions):
    logits, _ = model(inputs, segment_ids=segment_ids, positions=positions)
    return jnp.argmax(logits, axis=-1)


def _haystack(config, tokenizer, needed: int) -> np.ndarray:
    """Tokens of the held-out documents, in order, each closed by its end-of-document token; at least ``needed``."""
    _, close = tokenizer.document_ids()
    pieces, total = [], 0
    heldout = load_documents(config.data).heldout
    for index in range(len(heldout)):
        ids = np.asarray(tokenizer.encode(heldout[index]), np.int32)
        pieces += [ids, np.asarray([close], np.int32)]
        total += ids.size + 1
        if total >= 4 * needed:
            break
    if total < needed:
        raise ValueError(f"the held-out documents hold {total} tokens, fewer than the {needed} one example needs")
    return np.concatenate(pieces)


def text_needle_rows(config, *, length: int, depths, per_depth: int, seed: int = 1234):
    """``(rows [n, length] int32, answer_slices, depths)``: the examples of the module docstring."""
    if length > config.data.seq_len:
        raise ValueError(f"eval.needle.length={length} exceeds the run's data.seq_len={config.data.seq_len}")
    tokenizer = get_tokenizer(config.data.tokenizer)
    opening, _ = tokenizer.document_ids()
    rng = np.random.default_rng(seed)
    query = np.asarray(tokenizer.encode(QUERY), np.int32)
    haystack = _haystack(config, tokenizer, length)
    rows, answers, row_depths = [], [], []
    for depth in depths:
        for _ in range(per_depth):
            value = int(rng.integers(1000, 10000))
            needle = np.asarray(tokenizer.encode(NEEDLE.format(value=value)), np.int32)
            answer = np.asarray(tokenizer.encode(f" {value}"), np.int32)
            filler = length - 1 - needle.size - query.size - answer.size
            if filler < 1:
                raise ValueError(f"eval.needle.length={length} cannot hold the needle, query and answer")
            start = int(rng.integers(0, haystack.size - filler + 1))
            hay = haystack[start:start + filler]
            cut = round(float(depth) * filler)
            row = np.concatenate([[opening], hay[:cut], needle, hay[cut:], query, answer]).astype(np.int32)
            rows.append(row)
            answers.append(slice(length - answer.size, length))
            row_depths.append(float(depth))
    return np.stack(rows), answers, row_depths


def answer_hits(predicted: np.ndarray, targets: np.ndarray, answers) -> list[bool]:
    """Per row: is the argmax ``predicted[t]`` (which predicts ``targets[t] = row[t + 1]``) right at every answer token?

    ``answers[i]`` is the answer's slice of row ``i``; its tokens are ``targets[i, start - 1 : stop - 1]``.
    """
    return [bool(np.all(predicted[i, a.start - 1:a.stop - 1] == targets[i, a.start - 1:a.stop - 1]))
            for i, a in enumerate(answers)]


def text_needle_accuracy(model, config, *, length: int, depths, per_depth: int, seed: int = 1234,
                         batch_size: int = 8) -> dict:
    """``{"accuracy", "interval", "examples", "length", "by_depth": {depth: accuracy}}`` (module docstring).

    ``interval``: a 95 % percentile bootstrap of the accuracy over the examples."""
    rows, answers, row_depths = text_needle_rows(config, length=length, depths=depths, per_depth=per_depth, seed=seed)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    segment_ids = np.ones_like(inputs)
    positions = np.broadcast_to(np.arange(inputs.shape[1], dtype=np.int32), inputs.shape)
    hits = []
    for start in range(0, len(rows), batch_size):
        chunk = slice(start, start + batch_size)
        count = len(inputs[chunk])
        pad = batch_size - count  # one shape for every call (one compilation)
        batch = [np.concatenate([a[chunk], np.repeat(a[chunk][-1:], pad, axis=0)]) for a in (inputs, segment_ids,
                                                                                             positions)]
        predicted = np.asarray(jax.device_get(_argmax(model, *map(jnp.asarray, batch))))[:count]
        hits += answer_hits(predicted, targets[chunk], answers[chunk])
    by_depth = defaultdict(list)
    for depth, hit in zip(row_depths, hits):
        by_depth[round(depth, 4)].append(hit)
    return {"accuracy": float(np.mean(hits)), "interval": bootstrap_interval(np.asarray(hits, float), seed=seed),
            "examples": len(hits), "length": length,
            "by_depth": {str(depth): float(np.mean(h)) for depth, h in sorted(by_depth.items())}}
