"""Gated delta rule with a momentum pathway (MuonSSM on the Gated DeltaNet backbone), chunked.

Per (batch, head), with states ``S, M: [K, V]`` and per token ``q_t, k_t: [K]`` (k L2-normalised),
the injection's value ``w_t: [V]`` (the injection is ``W_t = k_t w_t^T``), the write strength
``beta_t``, the state's log decay ``g_t <= 0`` and the momentum's ``h_t <= 0``::

    M_t = exp(h_t) M_{t-1} + k_t w_t^T
    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + M_t
    o_t = scale * S_t^T q_t

The transition is not diagonal, so the scalar-decay closed form (``scalar_decay.py``) does not
apply; but M never depends on S, so the momentum only adds a known input to the gated delta rule
and the WY / UT chunk form of ``pallas_kernels.gated_delta_rule`` extends exactly. Write the
transition's correction as ``S_t = e^{g_t} S_{t-1} + k_t d_t^T + M_t`` with
``d_t = -beta_t e^{g_t} S_{t-1}^T k_t``. Within a chunk (``G``, ``H`` inclusive cumulative log
decays, ``L_G``, ``L_H``, ``kappa = L_G L_H``, ``mu = L_G e^H`` as in ``scalar_decay.py``;
``S_in``, ``M_in`` the states before the chunk)::

    S_t = e^{G_t} S_in + mu_t M_in + sum_{s<=t} k_s (L_G[t, s] d_s + kappa_ts w_s)^T

Substituting ``S_{r-1}`` into ``d_r`` and using ``e^{g_r} mu_{r-1} = mu_r - e^{H_r}`` and
``e^{g_r} kappa_{r-1, s} = kappa_rs - L_H[r, s]`` gives a unit lower-triangular system for the rows
of ``D = [d_0 .. d_{C-1}]``::

    (I + A) D = -diag(beta) [diag(e^G) K S_in + diag(mu - e^H) K M_in + ((K K^T) o (kappa - L_H)) W]
    A_rs = beta_r (k_r . k_s) e^{G_r - G_s}   (s < r; kappa - L_H is strictly lower triangular too)

With ``T = (I + A)^{-1}`` (a triangular solve) and the state-free ``W_S = T diag(beta e^G) K``,
``W_M = T diag(beta (mu - e^H)) K`` and ``E = T diag(beta) ((K K^T) o (kappa - L_H)) W``::

    D     = -(E + W_S S_in + W_M M_in)                                       (sequential: 2 matmuls)
    o_t   = scale * (e^{G_t} q_t^T S_in + mu_t q_t^T M_in
                     + sum_{s<=t} (q_t . k_s) (L_G[t, s] d_s + kappa_ts w_s))
    S_out = e^{G_e} S_in + mu_e M_in + sum_s k_s (L_G[e, s] d_s + kappa_es w_s)^T
    M_out = e^{H_e} M_in + sum_s L_H[e, s] k_s w_s^T

Only ``D`` and the state pair need the ``lax.scan`` over chunks; the kernels, the solve and the
outputs are parallel over chunks. With ``h = -inf`` (no momentum) this is the gated delta rule's
own chunk form (``w = beta v``). All exponents are <= 0; masked entries are exact zeros. The cost
over the gated delta rule: one more [C, C] x [C, C] product (kappa), a solve with K + V more
right-hand columns, and two [K, V] states per chunk; ``benchmarks/muonssm_cost.py`` measures it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from seqmodels.mixers.momentum._chunks import (HIGHEST, decay_matrix, from_chunks, momentum_kernels, to_chunks,
                                               zeros_state)


def _matmul(spec, *operands):
    return jnp.einsum(spec, *operands, precision=HIGHEST)


def _solve_chunks(k, w, beta, cum_decay, cum_momentum):
    """State-free per-chunk quantities ``(W_S, W_M, E)`` and the kernels ``(L_G, L_H, kappa, mu)``."""
    decay_mask, momentum_mask, kappa, mu = momentum_kernels(cum_decay, cum_momentum)
    key_products = _matmul("...rk,...sk->...rs", k, k)
    strict = beta[..., :, None] * key_products * decay_matrix(cum_decay, strict=True)
    from_momentum_inputs = _matmul("...rs,...sv->...rv", key_products * (kappa - momentum_mask), w)
    rhs = jnp.concatenate([(beta * jnp.exp(cum_decay))[..., None] * k,
                           (beta * (mu - jnp.exp(cum_momentum)))[..., None] * k,
                           beta[..., None] * from_momentum_inputs], axis=-1)
    eye = jnp.eye(k.shape[-2], dtype=jnp.float32)
    solved = jax.lax.linalg.triangular_solve(strict + eye, rhs, left_side=True, lower=True, unit_diagonal=True)
    key_dim = k.shape[-1]
    return (solved[..., :key_dim], solved[..., key_dim:2 * key_dim], solved[..., 2 * key_dim:]), (
        decay_mask, momentum_mask, kappa, mu)


def _chunk_step(row, state, momentum, chunk):
    """``(D, S_out, M_out)`` of one chunk from its start states; ``row`` is the chunk's end row."""
    k, w, solved_state, solved_momentum, solved_inputs, cum_decay, cum_momentum, decay_mask, momentum_mask, \
        kappa, mu = chunk
    corrections = -(solved_inputs + _matmul("...ck,...kv->...cv", solved_state, state)
                    + _matmul("...ck,...kv->...cv", solved_momentum, momentum))
    new_state = (jnp.exp(cum_decay[..., row])[..., None, None] * state + mu[..., row, None, None] * momentum
                 + _matmul("...s,...sk,...sv->...kv", decay_mask[..., row, :], k, corrections)
                 + _matmul("...s,...sk,...sv->...kv", kappa[..., row, :], k, w))
    new_momentum = (jnp.exp(cum_momentum[..., row])[..., None, None] * momentum
                    + _matmul("...s,...sk,...sv->...kv", momentum_mask[..., row, :], k, w))
    return corrections, new_state, new_momentum


def momentum_delta_rule(q, k, w, beta, log_decay, log_momentum_decay, *, scale: float, initial_state=None,
                        initial_momentum=None, chunk_size: int = 64):
    """``(o [B, T, H, V] in q.dtype, S_final, M_final [B, H, K, V] float32)``, chunked (module docstring).

    ``q, k: [B, T, H, K]``, ``w: [B, T, H, V]``, ``beta, log_decay, log_momentum_decay: [B, T, H]``.
    """
    length = q.shape[1]
    state0, momentum0 = zeros_state(q, w, initial_state), zeros_state(q, w, initial_momentum)
    q_c, k_c, w_c = (to_chunks(x, chunk_size) for x in (q, k, w))
    beta_c = to_chunks(beta, chunk_size)
    cum_decay = jnp.cumsum(to_chunks(log_decay, chunk_size), axis=-1)
    cum_momentum = jnp.cumsum(to_chunks(log_momentum_decay, chunk_size), axis=-1)
    solved, kernels = _solve_chunks(k_c, w_c, beta_c, cum_decay, cum_momentum)
    chunks = (k_c, w_c, *solved, cum_decay, cum_momentum, *kernels)

    def step(carry, chunk):
        corrections, new_state, new_momentum = _chunk_step(chunk_size - 1, *carry, chunk)
        return (new_state, new_momentum), (carry[0], carry[1], corrections)

    chunk_major = [jnp.moveaxis(x, 2, 0) for x in chunks]
    _, outputs = jax.lax.scan(step, (state0, momentum0), chunk_major)
    states, momenta, corrections = (jnp.moveaxis(x, 0, 2) for x in outputs)

    decay_mask, _, kappa, mu = kernels
    scores = _matmul("...tk,...sk->...ts", q_c, k_c)
    intra = (_matmul("...ts,...sv->...tv", scores * decay_mask, corrections)
             + _matmul("...ts,...sv->...tv", scores * kappa, w_c))
    from_state = _matmul("...tk,...kv->...tv", q_c * jnp.exp(cum_decay)[..., None], states)
    from_momentum = mu[..., None] * _matmul("...tk,...kv->...tv", q_c, momenta)
    o = from_chunks(scale * (intra + from_state + from_momentum), length)

    tail = [x[:, :, -1] for x in chunks]
    _, final_state, final_momentum = _chunk_step((length - 1) % chunk_size, states[:, :, -1], momenta[:, :, -1],
                                                 tail)
    return o.astype(q.dtype), final_state, final_momentum


def momentum_delta_rule_reference(q, k, w, beta, log_decay, log_momentum_decay, *, scale: float,
                                  initial_state=None, initial_momentum=None):
    """The same recurrence token by token (``lax.scan``): the oracle, and the one-token decoding step."""
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
