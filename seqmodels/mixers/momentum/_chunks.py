"""Chunk layout helpers of the momentum recurrences: padding, [B, T, H, ...] <-> [B, H, N, C, ...], decay masks."""

from __future__ import annotations

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def pad_time(x: jax.Array, chunk_size: int) -> jax.Array:
    """Zero-pad axis 1 (time) up to a multiple of ``chunk_size``."""
    pad = -x.shape[1] % chunk_size
    if not pad:
        return x
    return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


def to_chunks(x: jax.Array, chunk_size: int) -> jax.Array:
    """Float32 ``[B, T, H, ...] -> [B, H, N, C, ...]`` after padding T to ``N * C``."""
    x = pad_time(x.astype(jnp.float32), chunk_size)
    batch, length, heads = x.shape[:3]
    x = x.reshape(batch, length // chunk_size, chunk_size, heads, *x.shape[3:])
    return jnp.moveaxis(x, 3, 1)


def from_chunks(x: jax.Array, length: int) -> jax.Array:
    """``[B, H, N, C, D] -> [B, T, H, D]``, dropping the padding beyond ``length``."""
    batch, heads, num_chunks, chunk_size, width = x.shape
    x = jnp.moveaxis(x, 1, 3).reshape(batch, num_chunks * chunk_size, heads, width)
    return x[:, :length]


def decay_matrix(cumulative: jax.Array, *, strict: bool = False) -> jax.Array:
    """``exp(c_t - c_s)`` on ``s <= t`` (``s < t`` when strict), exactly 0 elsewhere: ``[..., C] -> [..., C, C]``.

    Masked entries are set to -inf *before* ``exp``, so every exponent evaluated is <= 0 (for
    non-increasing ``c``) and masked entries have zero gradient.
    """
    size = cumulative.shape[-1]
    rows, cols = jnp.arange(size)[:, None], jnp.arange(size)[None, :]
    mask = rows > cols if strict else rows >= cols
    difference = cumulative[..., :, None] - cumulative[..., None, :]
    return jnp.exp(jnp.where(mask, difference, -jnp.inf))


def momentum_kernels(cum_decay: jax.Array, cum_momentum: jax.Array):
    """``(L_G, L_H, kappa, mu)`` of one chunk from inclusive cumulative log decays ``[..., C]``.

    ``L_G[t, r] = e^{G_t - G_r}``, ``L_H[r, s] = e^{H_r - H_s}`` (lower triangular),
    ``kappa = L_G @ L_H`` and ``mu = L_G @ e^H``: see ``scalar_decay.py`` for their meaning.
    """
    state_mask, momentum_mask = decay_matrix(cum_decay), decay_matrix(cum_momentum)
    kappa = jnp.einsum("...tr,...rs->...ts", state_mask, momentum_mask, precision=HIGHEST)
    mu = jnp.einsum("...tr,...r->...t", state_mask, jnp.exp(cum_momentum), precision=HIGHEST)
    return state_mask, momentum_mask, kappa, mu


def zeros_state(q: jax.Array, v: jax.Array, state: jax.Array | None) -> jax.Array:
    """``state`` as float32 ``[B, H, K, V]``, or zeros of that shape."""
    if state is not None:
        return state.astype(jnp.float32)
    batch, _, heads, key_dim = q.shape
    return jnp.zeros((batch, heads, key_dim, v.shape[-1]), jnp.float32)
