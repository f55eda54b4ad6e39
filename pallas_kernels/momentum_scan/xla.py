"""The momentum recurrences of MuonSSM in chunk-parallel form (pure JAX; runs on every backend).

Both are defined token by token in ``reference.py``; the chunk kernels ``L_G``, ``L_H``, ``kappa``, ``mu``
(``momentum_kernels``) are shared.

**Scalar decay** (``scalar_decay``: the Mamba2 / SSD backbone).
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

**Delta rule** (``delta_rule``: the Gated DeltaNet backbone).
Per (batch, head), with states ``S, M: [K, V]`` and per token ``q_t, k_t: [K]`` (k L2-normalised),
the injection's value ``w_t: [V]`` (the injection is ``W_t = k_t w_t^T``), the write strength
``beta_t``, the state's log decay ``g_t <= 0`` and the momentum's ``h_t <= 0``::

    M_t = exp(h_t) M_{t-1} + k_t w_t^T
    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + M_t
    o_t = scale * S_t^T q_t

The transition is not diagonal, so the scalar-decay closed form above does not
apply; but M never depends on S, so the momentum only adds a known input to the gated delta rule
and the WY / UT chunk form of ``pallas_kernels.gated_delta_rule`` extends exactly. Write the
transition's correction as ``S_t = e^{g_t} S_{t-1} + k_t d_t^T + M_t`` with
``d_t = -beta_t e^{g_t} S_{t-1}^T k_t``. Within a chunk (``G``, ``H`` inclusive cumulative log
decays, ``L_G``, ``L_H``, ``kappa = L_G L_H``, ``mu = L_G e^H`` as in the scalar decay above;
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

from pallas_kernels._chunks import decay_matrix, from_chunks, pad_time, to_chunks
from pallas_kernels.momentum_scan.reference import HIGHEST, zeros_state


def _chunks32(x: jax.Array, chunk_size: int) -> jax.Array:
    """Float32 ``[B, T, H, ...] -> [B, H, N, C, ...]`` after padding T to ``N * C``."""
    return to_chunks(pad_time(x.astype(jnp.float32), chunk_size), chunk_size)


def momentum_kernels(cum_decay: jax.Array, cum_momentum: jax.Array):
    """``(L_G, L_H, kappa, mu)`` of one chunk from inclusive cumulative log decays ``[..., C]``.

    ``L_G[t, r] = e^{G_t - G_r}``, ``L_H[r, s] = e^{H_r - H_s}`` (lower triangular),
    ``kappa = L_G @ L_H`` and ``mu = L_G @ e^H``: see the scalar decay above for their meaning.
    """
    state_mask, momentum_mask = decay_matrix(cum_decay), decay_matrix(cum_momentum)
    kappa = jnp.einsum("...tr,...rs->...ts", state_mask, momentum_mask, precision=HIGHEST)
    mu = jnp.einsum("...tr,...r->...t", state_mask, jnp.exp(cum_momentum), precision=HIGHEST)
    return state_mask, momentum_mask, kappa, mu


# ----------------------------------------------------------------------------- scalar decay


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


def scalar_decay(q, k, v, log_decay, log_momentum_decay, *, scale: float, initial_state=None,
                          initial_momentum=None, chunk_size: int = 64):
    """``(o [B, T, H, V] in q.dtype, S_final, M_final [B, H, K, V] float32)``, chunked (module docstring).

    ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, ``log_decay, log_momentum_decay: [B, T, H]`` (<= 0).
    """
    length = q.shape[1]
    state0, momentum0 = zeros_state(q, v, initial_state), zeros_state(q, v, initial_momentum)
    q_c, k_c, v_c = (_chunks32(x, chunk_size) for x in (q, k, v))                  # [B, H, N, C, *]
    cum_decay = jnp.cumsum(_chunks32(log_decay, chunk_size), axis=-1)               # [B, H, N, C]
    cum_momentum = jnp.cumsum(_chunks32(log_momentum_decay, chunk_size), axis=-1)
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
    o = from_chunks(scale * (intra + from_state + from_momentum))[:, :length]

    final_row = (length - 1) % chunk_size
    tail = lambda x: x[:, :, -1]  # noqa: E731  (the last chunk)
    final_state, final_momentum = _end_state(final_row, tail(states), tail(momenta), tail(k_c), tail(v_c),
                                             tail(cum_decay), tail(cum_momentum), tail(mu), tail(kappa),
                                             tail(momentum_mask))
    return o.astype(q.dtype), final_state, final_momentum



# ----------------------------------------------------------------------------- delta rule


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


def delta_rule(q, k, w, beta, log_decay, log_momentum_decay, *, scale: float, initial_state=None,
                        initial_momentum=None, chunk_size: int = 64):
    """``(o [B, T, H, V] in q.dtype, S_final, M_final [B, H, K, V] float32)``, chunked (module docstring).

    ``q, k: [B, T, H, K]``, ``w: [B, T, H, V]``, ``beta, log_decay, log_momentum_decay: [B, T, H]``.
    """
    length = q.shape[1]
    state0, momentum0 = zeros_state(q, w, initial_state), zeros_state(q, w, initial_momentum)
    q_c, k_c, w_c = (_chunks32(x, chunk_size) for x in (q, k, w))
    beta_c = _chunks32(beta, chunk_size)
    cum_decay = jnp.cumsum(_chunks32(log_decay, chunk_size), axis=-1)
    cum_momentum = jnp.cumsum(_chunks32(log_momentum_decay, chunk_size), axis=-1)
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
    o = from_chunks(scale * (intra + from_state + from_momentum))[:, :length]

    tail = [x[:, :, -1] for x in chunks]
    _, final_state, final_momentum = _chunk_step((length - 1) % chunk_size, states[:, :, -1], momenta[:, :, -1],
                                                 tail)
    return o.astype(q.dtype), final_state, final_momentum
