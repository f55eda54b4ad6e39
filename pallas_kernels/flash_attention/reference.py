"""Softmax attention over packed rows with an explicit ``[B, H, T, T]`` mask: the oracle.

    visible(t, s) = seg_s != 0 and seg_s == seg_t and s <= t (causal) and t - s < window

    o_t = sum_s softmax_s(scale q_t . k_s over visible s) v_s        (0 when nothing is visible)

Shapes: q, k, v ``[B, H, T, D]``; segment ids ``[B, T]`` ints (0 = padding). Returns ``(o in q.dtype,
lse float32 [B, H, T])`` with ``lse_t = log sum_{visible s} exp(scale q_t . k_s)`` (+inf where
nothing is visible, so ``exp(score - lse) = 0`` there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def visible(segment_ids, *, causal: bool, window: int | None):
    """Boolean ``[B, 1, T, T]`` of the rule above (row t = query, column s = key)."""
    length = segment_ids.shape[1]
    index = jnp.arange(length)
    keep = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
    if causal:
        keep &= index[None, :, None] >= index[None, None, :]
    if window is not None:
        keep &= index[None, :, None] - index[None, None, :] < window
    return keep[:, None]


def attention(q, k, v, segment_ids, *, scale: float, causal: bool, window: int | None):
    scores = scale * jnp.einsum("bhtd,bhsd->bhts", q.astype(jnp.float32), k.astype(jnp.float32))
    keep = visible(segment_ids, causal=causal, window=window)
    scores = jnp.where(keep, scores, -jnp.inf)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    weights = jnp.exp(scores - peak)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    o = jnp.einsum("bhts,bhsd->bhtd", weights / jnp.where(total > 0, total, 1.0), v.astype(jnp.float32))
    lse = jnp.where(total[..., 0] > 0, peak[..., 0] + jnp.log(jnp.where(total[..., 0] > 0, total[..., 0], 1.0)),
                    jnp.inf)
    return o.astype(q.dtype), lse
