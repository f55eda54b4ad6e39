"""Scalar-decay state with a momentum pathway (MuonSSM on the Mamba2 / SSD backbone), chunked.

Per (batch, head), with states ``S, M: [K, V]`` and per token ``q_t, k_t: [K]``, ``v_t: [V]``, the
state's log decay ``g_t <= 0`` and the momentum's log decay ``h_t <= 0`` (``log gamma``, cut to
-30 at document starts)::

    M_t = exp(h_t) M_{t-1} + k_t v_t^T
    S_t = exp(g_t) S_{t-1} + M_t
    o_t = scale * S_t^T q_t

A second-order linear recurrence. Unrolled within a chunk of C tokens (``r = 0..C-1``; ``G``, ``H``
the inclusive cumulative sums of ``g``, ``h`` from the chunk's first token; ``S_in``, ``M_in`` the
states before the chunk)::

    M_r = e^{H_r} M_in + sum_{s<=r} e^{H_r - H_s} k_s v_s^T
    S_t = e^{G_t} S_in + sum_{r<=t} e^{G_t - G_r} M_r
        = e^{G_t} S_in + mu_t M_in + sum_{s<=t} kappa_ts k_s v_s^T

    kappa = L_G @ L_H,   L_G[t, r] = e^{G_t - G_r} (r <= t),   L_H[r, s] = e^{H_r - H_s} (s <= r)
    mu    = L_G @ e^H

For a constant ``h = log gamma``, ``L_H[r, s] = gamma^{r-s}`` and
``kappa_ts = sum_{r=s..t} e^{G_t - G_r} gamma^{r-s}``. Every exponent is <= 0, so every entry of
``L_G`` and ``L_H`` lies in [0, 1] and 0 <= kappa <= C: stable, and no per-token state is
materialised (only [C, C] matrices per chunk, as in SSD). Hence::

    o_t   = scale * (e^{G_t} q_t^T S_in + mu_t q_t^T M_in + sum_{s<=t} kappa_ts (q_t . k_s) v_s)
    S_out = e^{G_e} S_in + mu_e M_in + sum_s kappa_es k_s v_s^T            (e: the chunk's last row)
    M_out = e^{H_e} M_in + sum_s L_H[e, s] k_s v_s^T

Between chunks the pair follows ``[S; M] <- [[e^{G_e}, mu_e], [0, e^{H_e}]] [S; M] + [dS; dM]``: a
``lax.scan`` over chunks carrying (S, M); the [C, C] kernels, the increments dS, dM and the outputs
are parallel over chunks. The final states use the row of the last real token of the last chunk,
so padding the time axis never changes them. Everything is float32; gradients are JAX autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from seqmodels.mixers.momentum._chunks import HIGHEST, from_chunks, momentum_kernels, to_chunks, zeros_state


def _increments(keys, values, weights):
    """``sum_s weights[s] k_s v_s^T``: ``[..., C, K], [..., C, V], [..., C] -> [..., K, V]``."""
    return jnp.einsum("...s,...sk,...sv->...kv", weights, keys, values, precision=HIGHEST)


def _end_state(row, state, momentum, keys, values, cum_decay, cum_momentum, mu, kappa, momentum_mask):
    """``(S_out, M_out)`` at chunk row ``row`` from the chunk-start states (any leading axes)."""
    new_state = (jnp.exp(cum_decay[..., row])[..., None, None] * state
                 + mu[..., row, None, None] * momentum + _increments(keys, values, kappa[..., row, :]))
    new_momentum = (jnp.exp(cum_momentum[..., row])[..., None, None] * momentum
                    + _increments(keys, values, momentum_mask[..., row, :]))
    return new_state, new_momentum


def _scan_chunks(state_decay, momentum_carry, momentum_decay, state_increment, momentum_increment,
                 initial_state, initial_momentum):
    """States before every chunk, ``[B, H, N, K, V]`` each, from the 2x2 block recurrence."""

    def step(carry, chunk):
        state, momentum = carry
        decay, carry_in, m_decay, d_state, d_momentum = chunk
        new_state = decay[..., None, None] * state + carry_in[..., None, None] * momentum + d_state
        new_momentum = m_decay[..., None, None] * momentum + d_momentum
        return (new_state, new_momentum), (state, momentum)

    chunk_major = [jnp.moveaxis(x, 2, 0) for x in (state_decay, momentum_carry, momentum_decay,
                                                   state_increment, momentum_increment)]
    _, (states, momenta) = jax.lax.scan(step, (initial_state, initial_momentum), chunk_major)
    return jnp.moveaxis(states, 0, 2), jnp.moveaxis(momenta, 0, 2)


def momentum_scalar_decay(q, k, v, log_decay, log_momentum_decay, *, scale: float, initial_state=None,
                          initial_momentum=None, chunk_size: int = 64):
    """``(o [B, T, H, V] in q.dtype, S_final, M_final [B, H, K, V] float32)``, chunked (module docstring).

    ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, ``log_decay, log_momentum_decay: [B, T, H]`` (<= 0).
    """
    length = q.shape[1]
    state0, momentum0 = zeros_state(q, v, initial_state), zeros_state(q, v, initial_momentum)
    q_c, k_c, v_c = (to_chunks(x, chunk_size) for x in (q, k, v))                  # [B, H, N, C, *]
    cum_decay = jnp.cumsum(to_chunks(log_decay, chunk_size), axis=-1)               # [B, H, N, C]
    cum_momentum = jnp.cumsum(to_chunks(log_momentum_decay, chunk_size), axis=-1)
    decay_mask, momentum_mask, kappa, mu = momentum_kernels(cum_decay, cum_momentum)

    last = chunk_size - 1
    state_increment = _increments(k_c, v_c, kappa[..., last, :])
    momentum_increment = _increments(k_c, v_c, momentum_mask[..., last, :])
    states, momenta = _scan_chunks(jnp.exp(cum_decay[..., last]), mu[..., last], jnp.exp(cum_momentum[..., last]),
                                   state_increment, momentum_increment, state0, momentum0)

    scores = jnp.einsum("...tk,...sk->...ts", q_c, k_c, precision=HIGHEST) * kappa
    intra = jnp.einsum("...ts,...sv->...tv", scores, v_c, precision=HIGHEST)
    from_state = jnp.einsum("...tk,...kv->...tv", q_c * jnp.exp(cum_decay)[..., None], states, precision=HIGHEST)
    from_momentum = mu[..., None] * jnp.einsum("...tk,...kv->...tv", q_c, momenta, precision=HIGHEST)
    o = from_chunks(scale * (intra + from_state + from_momentum), length)

    final_row = (length - 1) % chunk_size
    tail = lambda x: x[:, :, -1]  # noqa: E731  (the last chunk)
    final_state, final_momentum = _end_state(final_row, tail(states), tail(momenta), tail(k_c), tail(v_c),
                                             tail(cum_decay), tail(cum_momentum), tail(mu), tail(kappa),
                                             tail(momentum_mask))
    return o.astype(q.dtype), final_state, final_momentum


def momentum_scalar_decay_reference(q, k, v, log_decay, log_momentum_decay, *, scale: float,
                                    initial_state=None, initial_momentum=None):
    """The same recurrence token by token (``lax.scan``): the oracle, and the one-token decoding step."""
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
