"""Recognition accuracy on the CFL suite, per language and string length.

A model's decision for a string is ``accept`` iff its logit of ``<accept>`` after [CLS] exceeds
that of ``<reject>``. Evaluation sets come from ``seqmodels.data.cfl.sample`` (half positive, hard
negatives) and are grouped by length: every row of a batch has exactly ``N + 2`` tokens, so a
looped model runs exactly ``loops(N)`` iterations over ``N + P(N) + 2`` positions for them.
A language without positives at N (odd lengths for Dyck, even for ``marked_palindrome`` ...) is
evaluated at the nearest shorter length that has them; results name the length used.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seqmodels.data.cfl import nearest_valid_length
from seqmodels.data.cfl.rows import evaluation_set
from seqmodels.special_tokens import ACCEPT_ID, REJECT_ID
from seqmodels.data.packing import pad_batch


class Classifier:
    """Accept/reject decisions of a model, jitted once per row length."""

    def __init__(self, model, *, batch_size: int = 128):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        graphdef, state = nnx.split(model)
        self._state = state

        @jax.jit
        def logits(state, inputs, segment_ids):
            return nnx.merge(graphdef, state)(inputs, segment_ids=segment_ids)

        self._logits = logits

    def logits(self, batch: dict) -> np.ndarray:
        """Read-out logits ``[rows, vocab]`` of a batch, computed ``batch_size`` rows at a time."""
        rows = batch["inputs"].shape[0]
        out = []
        for start in range(0, rows, self.batch_size):
            chunk = {key: batch[key][start:start + self.batch_size] for key in ("inputs", "segment_ids")}
            size = chunk["inputs"].shape[0]
            chunk = pad_batch(chunk, self.batch_size)  # one compiled shape per row length
            result = self._logits(self._state, jnp.asarray(chunk["inputs"]), jnp.asarray(chunk["segment_ids"]))
            out.append(np.asarray(result)[:size])
        return np.concatenate(out)

    def accepts(self, batch: dict) -> np.ndarray:
        logits = self.logits(batch)
        return logits[:, ACCEPT_ID] > logits[:, REJECT_ID]


def labels_of(batch: dict) -> np.ndarray:
    """The label (True = in the language) of every row: the target at its [CLS] position."""
    cls_index = batch["segment_ids"].astype(bool).sum(axis=1) - 1
    return batch["targets"][np.arange(cls_index.size), cls_index] == ACCEPT_ID


def evaluate_cfl(model, languages, lengths, *, num_examples: int = 256, seed: int = 1234,
                 batch_size: int = 128) -> dict:
    """``{language: {str(N): {"length": N_used, "accuracy": a, "examples": num}}}`` for a trained model."""
    classifier = Classifier(model, batch_size=batch_size)
    results = {}
    for language in languages:
        per_length = {}
        for length in lengths:
            used = nearest_valid_length(language, length)
            batch = evaluation_set(language, used, num_examples, seed)
            correct = classifier.accepts(batch) == labels_of(batch)
            per_length[str(length)] = {"length": used, "accuracy": float(correct.mean()),
                                       "examples": int(correct.size)}
        results[language] = per_length
    return results
