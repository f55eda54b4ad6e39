"""Document boundaries for recurrent mixers: state must not flow from one packed document to the next.

A row packs several documents (``segment_ids`` 1, 2, ...; 0 = padding). Attention masks across
them; a linear recurrence ``S_t = exp(g_t) S_{t-1} + ...`` is cut by setting the log decay at
each document's first token to ``RESET_LOG_DECAY``: ``exp(-30) ~ 1e-13``, so the state carried in
is wiped to float32 noise, while cumulative sums of log decays stay finite (no ``-inf - -inf``)
and, with at most one reset per token, small enough for float32 chunk arithmetic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

RESET_LOG_DECAY = -30.0


def document_starts(segment_ids: jax.Array) -> jax.Array:
    """Boolean ``[B, T]``: True at every token (after the first) whose segment differs from the one before."""
    changed = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = jnp.zeros((segment_ids.shape[0], 1), bool)  # not changed[:, :1], which is empty when T = 1
    return jnp.concatenate([first, changed], axis=1)


def reset_at_document_starts(log_decay: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """``log_decay [B, T, ...]`` with ``RESET_LOG_DECAY`` at document starts (unchanged if no segments)."""
    if segment_ids is None:
        return log_decay
    starts = document_starts(segment_ids).reshape(segment_ids.shape + (1,) * (log_decay.ndim - 2))
    return jnp.where(starts, jnp.asarray(RESET_LOG_DECAY, log_decay.dtype), log_decay)
