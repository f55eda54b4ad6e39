"""Chunk layout shared by the chunked forms of every op: time padding, chunk reshapes, chunk cumsums.

``[B, T, H, ...]`` inputs are cut along time into ``N = T / C`` chunks of ``C`` tokens. The chunked
forms hold chunks as ``[B, H, N, C, ...]`` (heads before chunks, so per-chunk matmuls batch over
``B, H, N``); the inputs' T is first zero-padded to a multiple of ``C``. A padded token must leave
the state untouched (``k = 0``, ``beta = 0``, log decay 0: ``S <- 1 * S + 0``); its outputs are sliced
off by the caller. Cumulative log decays restart at every chunk, so every decay a chunk uses is
``exp(c_t - c_s)`` with ``s <= t`` in one chunk (or ``exp(c_t)``): every exponent is <= 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pad_time(x: jax.Array, chunk_size: int) -> jax.Array:
    """Zero-pad axis 1 (time) of ``x`` up to a multiple of ``chunk_size`` (unchanged when it is one)."""
    pad = -x.shape[1] % chunk_size
    if not pad:
        return x
    return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


def chunk_local_cumsum(log_decay: jax.Array, chunk_size: int) -> jax.Array:
    """Float32 cumulative sum along time restarted at every chunk: ``[B, T, ...] -> [B, T, ...]`` (T padded).

    ``c_t`` = the sum of ``log_decay`` over the tokens of t's chunk up to and including t.
    """
    batch, length = log_decay.shape[:2]
    chunks = log_decay.astype(jnp.float32).reshape(batch, length // chunk_size, chunk_size, *log_decay.shape[2:])
    return jnp.cumsum(chunks, axis=2).reshape(log_decay.shape)


def to_chunks(x: jax.Array, chunk_size: int) -> jax.Array:
    """``[B, T, H, ...] -> [B, H, N, C, ...]`` with ``N = T / C`` (T already padded)."""
    batch, length, heads = x.shape[:3]
    x = x.reshape(batch, length // chunk_size, chunk_size, heads, *x.shape[3:])
    return jnp.moveaxis(x, 3, 1)


def from_chunks(x: jax.Array) -> jax.Array:
    """``[B, H, N, C, D] -> [B, N * C, H, D]`` (the inverse of ``to_chunks``; the caller drops the padding)."""
    batch, heads, num_chunks, chunk_size, width = x.shape
    return jnp.moveaxis(x, 1, 3).reshape(batch, num_chunks * chunk_size, heads, width)


def decay_matrix(cumulative: jax.Array, *, strict: bool = False) -> jax.Array:
    """``exp(c_t - c_s)`` on ``s <= t`` (``s < t`` when strict), exactly 0 elsewhere: ``[..., C] -> [..., C, C]``.

    Masked entries are set to -inf *before* ``exp``, so every exponent evaluated is <= 0 (for a
    non-increasing ``c``) and masked entries are exact zeros with zero gradient (never ``inf * 0``).
    """
    size = cumulative.shape[-1]
    rows, cols = jnp.arange(size)[:, None], jnp.arange(size)[None, :]
    mask = rows > cols if strict else rows >= cols
    difference = cumulative[..., :, None] - cumulative[..., None, :]
    return jnp.exp(jnp.where(mask, difference, -jnp.inf))
