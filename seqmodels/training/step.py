"""The pure train step: ``train_step(state, batch) -> (state, metrics)``.

The batch ``[B, L]`` is split into ``grad_accum`` micro-batches ``[A, B/A, L]`` scanned in order;
each contributes the gradient of its *summed* loss, and the sum is divided once by the total number
of loss tokens. The result therefore equals the gradient of the mean loss over the whole batch,
whatever the accumulation factor (up to float summation order).

With a ``trainable`` predicate (``seqmodels.models.trainable_filter``) only the parameters it selects
are differentiated, updated and given optimizer state; the rest are carried over untouched. Every
micro-batch also carries the step number (``"step"``) for models that draw per-step choices from it.
The metrics also hold the per-layer diagnostics the mixers sow during the forward
(``seqmodels.training.diagnostics``, e.g. ``atlas/layer_0/memory_norm``), averaged over the
micro-batches; they take no second forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from seqmodels.training.diagnostics import loss_and_diagnostics
from seqmodels.models.trainable import merge_params, split_params


def _split_microbatches(batch: dict, grad_accum: int) -> dict:
    def split(x):
        if x.shape[0] % grad_accum:
            raise ValueError(f"batch of {x.shape[0]} rows is not divisible by train.grad_accum={grad_accum}")
        return x.reshape(grad_accum, x.shape[0] // grad_accum, *x.shape[1:])
    return jax.tree.map(split, batch)


def make_train_step(graphdef, optimizer: optax.GradientTransformation, schedule, *, grad_accum: int = 1,
                    trainable=None):
    """The step function (not jitted: the loop jits it with explicit shardings)."""
    select = trainable or (lambda path: True)

    def summed_loss(params, frozen, micro):
        model = nnx.merge(graphdef, merge_params(params, frozen))
        (loss_sum, count), diagnostics = loss_and_diagnostics(model, micro)
        return loss_sum, (count, diagnostics)

    grad_fn = jax.value_and_grad(summed_loss, has_aux=True)

    def train_step(state: dict, batch: dict):
        params, frozen = (state["params"], {}) if trainable is None else split_params(state["params"], select)
        micro = _split_microbatches(batch, grad_accum)
        zeros = jax.tree.map(jnp.zeros_like, params)

        def accumulate(carry, one):
            grads, loss_sum, count = carry
            (micro_loss, (micro_count, diagnostics)), micro_grads = grad_fn(params, frozen,
                                                                            {**one, "step": state["step"]})
            grads = jax.tree.map(jnp.add, grads, micro_grads)
            return (grads, loss_sum + micro_loss, count + micro_count), diagnostics

        init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
        (grads, loss_sum, count), diagnostics = jax.lax.scan(accumulate, init, micro)
        denominator = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g: g / denominator, grads)
        updates, opt_state = optimizer.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        new_state = {"step": state["step"] + 1,
                     "params": new_params if trainable is None else merge_params(new_params, frozen),
                     "opt_state": opt_state}
        metrics = {"loss": loss_sum / denominator, "grad_norm": optax.tree.norm(grads),
                   "learning_rate": schedule(state["step"]), "loss_tokens": count,
                   **{name: jnp.mean(values) for name, values in diagnostics.items()}}
        return new_state, metrics

    return train_step
