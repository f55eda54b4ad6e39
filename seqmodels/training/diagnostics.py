"""Per-layer diagnostics of the training forward: what the mixers sow, as scalar metrics.

A mixer sows a dict of scalars under an ``nnx.Intermediate`` named ``<kind>_diagnostics`` (the
``atlas`` mixer: ``atlas_diagnostics``, see ``seqmodels/mixers/atlas.py``); ``loss_and_diagnostics``
runs ``model.loss`` under ``nnx.capture`` and flattens what was sown into metrics named
``<kind>/layer_<i>/<quantity>``, ``i`` the block's index in ``model.mixers`` (also with
``model.scan_layers``: ``LM`` sows its scanned groups' intermediates in the unrolled layout, as
``scanned_blocks``). A block called more than once in a forward (a looped model's shared block
called outside a scan) reports the mean of its calls; blocks inside a looped model's scanned loop
report nothing. Outside ``nnx.capture`` sowing is a no-op, so evaluation and decoding are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
from flax import nnx

SUFFIX = "_diagnostics"


def _walk(tree, path=()):
    """``(path, sown values)`` for every ``*_diagnostics`` entry of a nested mapping."""
    for key, value in tree.items():
        if isinstance(key, str) and key.endswith(SUFFIX):
            yield (*path, key), value
        elif isinstance(value, Mapping):
            yield from _walk(value, (*path, key))


def _layer(path) -> int:
    """The block index: the integer that follows ``blocks`` in the path."""
    for before, key in zip(path, path[1:]):
        if before == "blocks" and isinstance(key, int):
            return key
    raise ValueError(f"diagnostics sown outside a block of model.mixers: {path}")


def flatten(intermediates) -> dict[str, jnp.ndarray]:
    """``{"<kind>/layer_<i>/<quantity>": scalar}`` from the ``nnx.Intermediate`` state ``nnx.capture`` returned."""
    metrics = {}
    for path, calls in _walk(nnx.to_pure_dict(intermediates)):
        kind = path[-1][:-len(SUFFIX)]
        calls = calls if isinstance(calls, tuple) else (calls,)
        for quantity in calls[0]:
            metrics[f"{kind}/layer_{_layer(path)}/{quantity}"] = jnp.mean(
                jnp.stack([jnp.asarray(call[quantity], jnp.float32) for call in calls]))
    return metrics


def loss_and_diagnostics(model, batch: dict):
    """``((loss_sum, count), diagnostics)``: ``model.loss(batch)`` and the flattened diagnostics of its forward."""
    (loss_sum, count), intermediates = nnx.capture(model.loss, nnx.Intermediate)(batch)
    return (loss_sum, count), flatten(intermediates)
