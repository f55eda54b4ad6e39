"""Token-by-token gated delta rule: the oracle the chunked forms are tested against.

Per token t, with state ``S`` of shape ``[K, V]`` per (batch, head)::

    S   = exp(log_decay_t) * S_{t-1}          (no decay when log_decay is None: DeltaNet)
    u_t = beta_t * (v_t - S^T k_t)             (the delta-rule correction)
    S_t = S + k_t u_t^T
    o_t = scale * S_t^T q_t

The state is carried in float32 whatever the input dtype; ``o`` comes back in ``q.dtype`` and the
final state in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def gated_delta_rule_reference(q, k, v, beta, log_decay=None, *, scale, initial_state=None):
    """``lax.scan`` over tokens. Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; gates ``[B, T, H]``.

    Returns ``(o [B, T, H, V] in q.dtype, final_state [B, H, K, V] float32)``.
    """
    batch, _, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    f32 = jnp.float32
    if log_decay is None:
        log_decay = jnp.zeros(beta.shape, f32)
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, key_dim, value_dim), f32)

    def step(state, token):
        q_t, k_t, v_t, beta_t, log_decay_t = token
        state = jnp.exp(log_decay_t)[..., None, None] * state
        predicted = jnp.einsum("bhk,bhkv->bhv", k_t, state, precision=_HIGHEST)
        update = beta_t[..., None] * (v_t - predicted)
        state = state + k_t[..., :, None] * update[..., None, :]
        o_t = scale * jnp.einsum("bhk,bhkv->bhv", q_t, state, precision=_HIGHEST)
        return state, o_t

    time_major = [jnp.moveaxis(x.astype(f32), 1, 0) for x in (q, k, v, beta, log_decay)]
    final_state, o = jax.lax.scan(step, initial_state.astype(f32), time_major)
    return jnp.moveaxis(o, 0, 1).astype(q.dtype), final_state
