"""Needle-in-a-haystack accuracy: the model's greedy continuation of the query, exact match.

For each example (``seqmodels.data.sources.needle.NeedleExample``) the model decodes
``len(answer)`` tokens after the prompt with ``seqmodels.models.generate`` (temperature 0, the
decoding cache); the example counts as retrieved iff every decoded token equals the answer.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from seqmodels.evaluation.decoding import greedy_continuations


def needle_accuracy(model, examples, *, batch_size: int = 32) -> dict:
    """``{"accuracy", "examples", "by_depth": {depth: accuracy}}`` over ``examples`` of one prompt length."""
    if not examples:
        raise ValueError("examples must not be empty")
    prompts = np.stack([e.prompt for e in examples])
    answers = np.stack([e.answer for e in examples])
    if prompts.ndim != 2 or answers.ndim != 2:
        raise ValueError("examples must share one prompt length and one answer length")
    decoded = greedy_continuations(model, prompts, answers.shape[1], batch_size)
    correct = np.all(decoded == answers, axis=1)
    by_depth = defaultdict(list)
    for example, hit in zip(examples, correct):
        by_depth[round(example.depth, 4)].append(bool(hit))
    return {"accuracy": float(correct.mean()), "examples": int(correct.size),
            "by_depth": {depth: float(np.mean(hits)) for depth, hits in sorted(by_depth.items())}}
