"""Oracle for gated linear attention: one ``lax.scan`` step per token, float32 state.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,     o_t = scale * S_t^T q_t

Shapes: ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, ``log_decay g: [B, T, H, K]`` (a per-head
decay arrives here broadcast to ``[B, T, H, 1]``), ``initial_state: [B, H, K, V]`` float32.
Returns ``o`` float32 ``[B, T, H, V]`` and the final state float32 ``[B, H, K, V]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def chunk_gla(q, k, v, log_decay, scale: float, initial_state):
    """Token-by-token recurrence; gradients come from JAX's differentiation of ``lax.scan``."""

    def step(state, inputs):
        q_t, k_t, v_t, g_t = inputs  # [B, H, K], [B, H, K], [B, H, V], [B, H, K or 1]
        state = jnp.exp(g_t)[..., None] * state + k_t[..., :, None] * v_t[..., None, :]
        o_t = scale * jnp.einsum("bhk,bhkv->bhv", q_t, state)
        return state, o_t

    time_major = [jnp.swapaxes(x.astype(jnp.float32), 0, 1) for x in (q, k, v, log_decay)]
    final_state, o = jax.lax.scan(step, initial_state.astype(jnp.float32), time_major)
    return jnp.swapaxes(o, 0, 1), final_state
