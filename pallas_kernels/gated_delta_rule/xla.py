"""Chunk-parallel gated delta rule in pure JAX (WY / UT-transform form); runs on every backend.

Derivation. Split time into chunks of ``C`` tokens. Inside one chunk index tokens ``i = 1..C``,
let ``gamma_i`` be the cumulative log decay from the chunk start (``chunk_local_cumsum``) and
``S_0`` the state entering the chunk. Unrolling the recurrence of ``reference.py``::

    S_i = exp(gamma_i) S_0 + sum_{j <= i} exp(gamma_i - gamma_j) k_j u_j^T
    u_i = beta_i (v_i - exp(gamma_i) S_0^T k_i - sum_{j < i} exp(gamma_i - gamma_j) (k_i . k_j) u_j)

The last line is a unit lower-triangular system for the rows of ``U = [u_1 .. u_C]``::

    (I + A) U = diag(beta) V - diag(beta exp(gamma)) K S_0,
    A_ij = beta_i (k_i . k_j) exp(gamma_i - gamma_j)   for j < i, 0 otherwise.

With ``T = (I + A)^{-1}`` (the UT transform; here a triangular solve, in the kernels forward
substitution), and the chunk-local, state-free quantities::

    W = T diag(beta exp(gamma)) K        [C, K]
    U~ = T diag(beta) V                  [C, V]

the chunk's corrected values are ``V_new = U~ - W S_0`` (WY form), and

    o_i     = scale * (exp(gamma_i) q_i^T S_0 + sum_{j <= i} exp(gamma_i - gamma_j) (q_i . k_j) V_new_j)
    S_C     = exp(gamma_C) S_0 + sum_j exp(gamma_C - gamma_j) k_j V_new_j^T

``W`` and ``U~`` need no state, so they are computed for all chunks at once; only the short
``lax.scan`` over chunks (two matmuls per step) is sequential. The intra-chunk attention term and
``q S_0`` are again parallel over chunks once the chunk-start states are known.

All exponents are differences ``gamma_i - gamma_j`` with ``j <= i`` or ``gamma_i`` itself, so
<= 0: masked entries are set to ``-inf`` *before* ``exp`` (giving 0, never ``inf * 0``).
Everything is computed in float32; ``o`` is returned in ``q.dtype``, the final state in float32.
Gradients come from JAX autodiff of this function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._chunks import chunk_local_cumsum, decay_matrix, from_chunks, pad_time, to_chunks

_HIGHEST = jax.lax.Precision.HIGHEST


def ut_transform(k, v, beta, gamma):
    """``W = T diag(beta e^gamma) K`` and ``U~ = T diag(beta) V`` per chunk; ``[B, H, N, C, *]``."""
    size = k.shape[-2]
    kk = jnp.einsum("...ik,...jk->...ij", k, k, precision=_HIGHEST)
    a = beta[..., :, None] * kk * decay_matrix(gamma, strict=True)
    rhs = jnp.concatenate([(beta * jnp.exp(gamma))[..., None] * k, beta[..., None] * v], axis=-1)
    eye = jnp.eye(size, dtype=a.dtype)
    solved = jax.lax.linalg.triangular_solve(
        a + eye, rhs, left_side=True, lower=True, unit_diagonal=True
    )
    return solved[..., : k.shape[-1]], solved[..., k.shape[-1] :]


def _scan_chunks(k, w, u, gamma, initial_state):
    """Sequential part: returns (chunk-start states ``[B, H, N, K, V]``, V_new, final state)."""

    def step(state, chunk):
        k_c, w_c, u_c, gamma_c = chunk
        v_new = u_c - jnp.einsum("bhck,bhkv->bhcv", w_c, state, precision=_HIGHEST)
        gamma_last = gamma_c[..., -1]
        k_decayed = k_c * jnp.exp(gamma_last[..., None] - gamma_c)[..., None]
        added = jnp.einsum("bhck,bhcv->bhkv", k_decayed, v_new, precision=_HIGHEST)
        new_state = jnp.exp(gamma_last)[..., None, None] * state + added
        return new_state, (state, v_new)

    chunk_major = [jnp.moveaxis(x, 2, 0) for x in (k, w, u, gamma)]
    final_state, (states, v_new) = jax.lax.scan(step, initial_state, chunk_major)
    return jnp.moveaxis(states, 0, 2), jnp.moveaxis(v_new, 0, 2), final_state


def _chunk_outputs(q, k, v_new, states, gamma, scale):
    """``o = scale (diag(e^gamma) Q S_0 + (Q K^T o decay) V_new)`` for all chunks at once."""
    from_state = jnp.einsum(
        "bhnck,bhnkv->bhncv", q * jnp.exp(gamma)[..., None], states, precision=_HIGHEST
    )
    scores = jnp.einsum("...ik,...jk->...ij", q, k, precision=_HIGHEST)
    scores = scores * decay_matrix(gamma, strict=False)
    intra = jnp.einsum("...ij,...jv->...iv", scores, v_new, precision=_HIGHEST)
    return scale * (from_state + intra)


def gated_delta_rule_xla(
    q, k, v, beta, log_decay=None, *, scale, initial_state=None, chunk_size=64
):
    """Chunked gated delta rule. Shapes as ``reference.py``; returns ``(o, final_state float32)``."""
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    f32 = jnp.float32
    if log_decay is None:
        log_decay = jnp.zeros(beta.shape, f32)
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, key_dim, value_dim), f32)
    padded = [pad_time(x.astype(f32), chunk_size) for x in (q, k, v, beta, log_decay)]
    q_p, k_p, v_p, beta_p, log_decay_p = padded
    gamma = to_chunks(chunk_local_cumsum(log_decay_p, chunk_size), chunk_size)
    q_c, k_c, v_c = (to_chunks(x, chunk_size) for x in (q_p, k_p, v_p))
    beta_c = to_chunks(beta_p, chunk_size)
    w, u = ut_transform(k_c, v_c, beta_c, gamma)
    states, v_new, final_state = _scan_chunks(k_c, w, u, gamma, initial_state.astype(f32))
    o = _chunk_outputs(q_c, k_c, v_new, states, gamma, scale)
    return from_chunks(o)[:, :length].astype(q.dtype), final_state
