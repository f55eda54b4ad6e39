"""Rotary position embedding (RoPE), the half-split layout: pairs are (x[i], x[i + D/2]); and the fixed
sinusoidal position features of the same frequencies, for models that add positions to the embeddings."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def apply_rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotate ``x: [B, T, H, D]`` by angle ``position * theta^(-2i/D)`` per pair ``i``; ``positions: [B, T]``."""
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head dimension, got {head_dim}")
    half = head_dim // 2
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def sinusoidal_positions(positions: jax.Array, dim: int, theta: float) -> jax.Array:
    """``[..., dim]`` features ``(sin(p w_i), cos(p w_i))`` of ``positions: [...]``, ``w_i = theta^(-2i/dim)``.

    The half-split layout of ``apply_rotary``: sines in the first half, cosines in the second; each
    (sin, cos) pair has norm 1. By the angle-difference identities the features of position p - q
    are bilinear in those of p and q.
    """
    if dim % 2 or dim <= 0:
        raise ValueError(f"sinusoidal positions need a positive even dimension, got {dim}")
    half = dim // 2
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
