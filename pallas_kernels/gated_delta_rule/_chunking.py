"""Layout helpers shared by the chunked implementations (XLA and Pallas)."""

from __future__ import annotations

import jax.numpy as jnp


def pad_time(x, chunk_size: int):
    """Zero-pad axis 1 (time) of ``x`` up to a multiple of ``chunk_size``.

    Padded tokens carry ``beta = 0``, ``k = 0`` and ``log_decay = 0``, so they leave the state
    untouched: ``u = 0``, ``S <- 1 * S + 0``. Their outputs are sliced off by the caller.
    """
    length = x.shape[1]
    padded = -(-length // chunk_size) * chunk_size
    if padded == length:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, padded - length)
    return jnp.pad(x, widths)


def chunk_local_cumsum(log_decay, chunk_size: int):
    """Cumulative log decay restarted at every chunk, ``[B, T, H] -> [B, T, H]`` in float32.

    ``gamma_t = sum of log_decay over the tokens of t's chunk up to and including t``; every decay
    the kernels use is ``exp(gamma_i - gamma_j)`` with ``j <= i`` in one chunk, or ``exp(gamma_i)``,
    so every exponent is <= 0 and nothing overflows.
    """
    batch, length, heads = log_decay.shape
    chunks = log_decay.astype(jnp.float32).reshape(batch, length // chunk_size, chunk_size, heads)
    return jnp.cumsum(chunks, axis=2).reshape(batch, length, heads)
