"""The momentum recurrences of MuonSSM token by token (``lax.scan``): the oracles, and the decoding step.

Per batch row and head, states ``S, M: [K, V]`` (float32), per token ``q_t, k_t: [K]``, a value
``v_t`` (or the injection's ``w_t``) ``[V]``, log decays ``g_t, h_t <= 0`` of the state and the
momentum (``h = log gamma``, cut to -30 at document starts), and for the delta rule a write strength
``beta_t``::

    scalar_decay:  M_t = e^{h_t} M_{t-1} + k_t v_t^T,   S_t = e^{g_t} S_{t-1} + M_t
    delta_rule:    M_t = e^{h_t} M_{t-1} + k_t w_t^T,   S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + M_t
    o_t = scale * S_t^T q_t
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def zeros_state(q: jax.Array, v: jax.Array, state: jax.Array | None) -> jax.Array:
    """``state`` as float32 ``[B, H, K, V]``, or zeros of that shape."""
    if state is not None:
        return state.astype(jnp.float32)
    batch, _, heads, key_dim = q.shape
    return jnp.zeros((batch, heads, key_dim, v.shape[-1]), jnp.float32)


def scalar_decay(q, k, v, log_decay, log_momentum_decay, *, scale: float, initial_state=None, initial_momentum=None):
    """``(o [B, T, H, V] in q.dtype, S_final, M_final [B, H, K, V] float32)`` of the scalar-decay rule."""
    f32 = jnp.float32
    state0, momentum0 = zeros_state(q, v, initial_state), zeros_state(q, v, initial_momentum)

    def step(carry, token):
        state, momentum = carry
        q_t, k_t, v_t, g_t, h_t = token
        momentum = jnp.exp(h_t)[..., None, None] * momentum + k_t[..., :, None] * v_t[..., None, :]
        state = jnp.exp(g_t)[..., None, None] * state + momentum
        return (state, momentum), scale * jnp.einsum("bhk,bhkv->bhv", q_t, state, precision=HIGHEST)

    time_major = [jnp.moveaxis(x.astype(f32), 1, 0) for x in (q, k, v, log_decay, log_momentum_decay)]
    (state, momentum), o = jax.lax.scan(step, (state0, momentum0), time_major)
    return jnp.moveaxis(o, 0, 1).astype(q.dtype), state, momentum


def delta_rule(q, k, w, beta, log_decay, log_momentum_decay, *, scale: float, initial_state=None,
               initial_momentum=None):
    """``(o [B, T, H, V] in q.dtype, S_final, M_final [B, H, K, V] float32)`` of the delta rule with momentum."""
    state0, momentum0 = zeros_state(q, w, initial_state), zeros_state(q, w, initial_momentum)

    def step(carry, token):
        state, momentum = carry
        q_t, k_t, w_t, beta_t, g_t, h_t = token
        momentum = jnp.exp(h_t)[..., None, None] * momentum + k_t[..., :, None] * w_t[..., None, :]
        state = jnp.exp(g_t)[..., None, None] * state
        predicted = jnp.einsum("bhk,bhkv->bhv", k_t, state, precision=HIGHEST)
        state = state - beta_t[..., None, None] * k_t[..., :, None] * predicted[..., None, :] + momentum
        return (state, momentum), scale * jnp.einsum("bhk,bhkv->bhv", q_t, state, precision=HIGHEST)

    inputs = (q, k, w, beta, log_decay, log_momentum_decay)
    time_major = [jnp.moveaxis(x.astype(jnp.float32), 1, 0) for x in inputs]
    (state, momentum), o = jax.lax.scan(step, (state0, momentum0), time_major)
    return jnp.moveaxis(o, 0, 1).astype(q.dtype), state, momentum
