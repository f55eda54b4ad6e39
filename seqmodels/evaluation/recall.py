"""Recall accuracy on the generated tasks (MQAR, selective copying) of ``seqmodels.data.sources.recall``.

For every held-out example the model reads the whole row at once (teacher forcing) and an answer
token counts as recalled when the argmax of its logits is the answer. Reported per task:
``accuracy`` (share of answer tokens recalled), ``example_accuracy`` (share of rows with every
answer recalled), ``loss`` (mean cross-entropy on answers) and the counts.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from seqmodels.config import SYNTHETIC_TASKS, ConfigError
from seqmodels.data.pipeline import make_eval_batches
from seqmodels.evaluation.intervals import bootstrap_interval


@nnx.jit
def _answer_scores(model, batch):
    logits, _ = model(batch["inputs"], segment_ids=batch["segment_ids"], positions=batch["positions"])
    correct = jnp.argmax(logits, axis=-1) == batch["targets"]
    return correct, optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])


def default_tasks(config) -> tuple[str, ...]:
    """The run's own task when it trained on one, else every synthetic task."""
    return (config.data.source,) if config.data.source in SYNTHETIC_TASKS else SYNTHETIC_TASKS


def evaluate_recall(model, config, *, tasks=None, batch_size: int = 32, max_batches: int = 8) -> dict:
    """``{task: {accuracy, example_accuracy, interval, loss, answers, examples}}`` over held-out examples.

    ``interval``: a 95 % percentile bootstrap of ``accuracy`` over the examples (each weighted by its answers).

    Examples follow ``config.data`` (``seq_len``, ``synthetic``, ``seed``) with ``source`` set to each
    task. Raises ``ConfigError`` when a task is unknown, does not fit ``data.seq_len``, or uses token
    ids beyond the model's ``vocab_size``.
    """
    results = {}
    for task in tasks or default_tasks(config):
        if task not in SYNTHETIC_TASKS:
            raise ConfigError(f"recall: unknown task {task!r}; known: {', '.join(SYNTHETIC_TASKS)}")
        data = dataclasses.replace(config.data, source=task)
        if config.model.vocab_size < data.synthetic.vocab_size:
            raise ConfigError(f"recall: data.synthetic.vocab_size={data.synthetic.vocab_size} exceeds "
                              f"model.vocab_size={config.model.vocab_size}")
        correct_sum = loss_sum = answers = rows = rows_right = 0.0
        row_right, row_answers = [], []  # per example: answers right, answers
        for batch in make_eval_batches(data, batch_size=batch_size, max_batches=max_batches):
            correct, losses = jax.device_get(_answer_scores(model, {k: jnp.asarray(v) for k, v in batch.items()}))
            mask = np.asarray(batch["loss_mask"]) > 0
            correct_sum += float((correct & mask).sum())
            loss_sum += float(losses[mask].sum())
            answers += float(mask.sum())
            real = mask.any(axis=1)  # padding rows have no answers
            rows += float(real.sum())
            rows_right += float((real & (correct | ~mask).all(axis=1)).sum())
            row_right.append((correct & mask).sum(axis=1)[real])
            row_answers.append(mask.sum(axis=1)[real])
        right, count = np.concatenate(row_right), np.concatenate(row_answers)
        results[task] = {"accuracy": correct_sum / answers, "example_accuracy": rows_right / rows,
                         "interval": bootstrap_interval(right / count, count, seed=config.data.seed),
                         "loss": loss_sum / answers, "answers": int(answers), "examples": int(rows)}
    return results
