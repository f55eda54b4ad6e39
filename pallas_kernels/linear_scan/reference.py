"""Oracle for the diagonal linear scan: one ``lax.scan`` step per token, float32 carry.

    h_t = a_t * h_{t-1} + b_t,   h_{-1} = initial      (reverse=False)
    h_t = a_t * h_{t+1} + b_t,   h_T    = initial      (reverse=True)

Shapes: ``a, b: [B, T, D]``, ``initial: [B, D]`` (float32), result ``[B, T, D]`` in float32.
Gradients come from JAX's own differentiation of ``lax.scan``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def linear_scan(a: jax.Array, b: jax.Array, initial: jax.Array, reverse: bool) -> jax.Array:
    """Sequential scan over axis 1; returns float32 ``[B, T, D]``."""

    def step(h, ab):
        a_t, b_t = ab
        h = a_t * h + b_t
        return h, h

    time_major = (jnp.swapaxes(a, 0, 1).astype(jnp.float32), jnp.swapaxes(b, 0, 1).astype(jnp.float32))
    _, h = jax.lax.scan(step, initial.astype(jnp.float32), time_major, reverse=reverse)
    return jnp.swapaxes(h, 0, 1)
