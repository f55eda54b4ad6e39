"""Diagonal linear scan in pure JAX: ``lax.associative_scan`` forward and backward.

The pair ``(a, b)`` composes as ``(a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)`` (apply 1, then 2),
which is associative, so the scan runs in O(log T) depth. The initial state folds into the first
element scanned: ``b_first += a_first * initial``.

Backward (forward direction; reverse=True mirrors every index):

    g_t = dL/dh_t + a_{t+1} g_{t+1}          (a reverse linear scan, g_T = 0)
    dL/db_t = g_t,   dL/da_t = g_t h_{t-1},   dL/dinitial = a_0 g_0,   h_{-1} = initial

All arithmetic is float32. Shapes: ``b, h, dh: [B, T, ..., D]``, ``initial: [B, ..., D]``, and ``a`` of
the shape of ``b`` or of ``[B, T, ..., 1]`` (one decay per row of the last axis, broadcast over it at
use: ``da`` is then summed over that axis).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _compose(first, second):
    a1, b1 = first
    a2, b2 = second
    return a1 * a2, a2 * b1 + b2


def scan_forward(a: jax.Array, b: jax.Array, initial: jax.Array, reverse: bool) -> jax.Array:
    """``h`` as float32 ``[B, T, D]``."""
    a = a.astype(jnp.float32)
    b = b.astype(jnp.float32)
    first = -1 if reverse else 0
    b = b.at[:, first].add(a[:, first] * initial.astype(jnp.float32))
    _, h = jax.lax.associative_scan(_compose, (a, b), axis=1, reverse=reverse)
    return h


def _shift(x: jax.Array, fill: jax.Array, toward_end: bool) -> jax.Array:
    """Shift along time by one step: ``out_t = x_{t-1}`` (toward_end) or ``x_{t+1}``, ``fill`` at the edge."""
    fill = fill[:, None].astype(x.dtype)
    if toward_end:
        return jnp.concatenate([fill, x[:, :-1]], axis=1)
    return jnp.concatenate([x[:, 1:], fill], axis=1)


def scan_backward(a, h, initial, dh, reverse: bool):
    """Cotangents ``(da, db, dinitial)`` in float32 from the forward output ``h``; ``da`` has the shape of ``a``."""
    a = a.astype(jnp.float32)
    zeros = jnp.zeros_like(initial, dtype=jnp.float32)
    # The coefficient that carries g_{t+1} into g_t is a_{t+1} (a_{t-1} for a reverse scan).
    a_carry = _shift(a, jnp.zeros_like(a[:, 0]), toward_end=reverse)
    g = scan_forward(a_carry, dh, zeros, reverse=not reverse)
    h_previous = _shift(h.astype(jnp.float32), initial, toward_end=not reverse)
    first = -1 if reverse else 0
    da = g * h_previous
    if a.shape != da.shape:  # a decay per row, broadcast over the last axis
        da = jnp.sum(da, axis=-1, keepdims=True)
    return da, g, a[:, first] * g[:, first]
