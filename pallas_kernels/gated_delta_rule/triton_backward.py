"""Backward Pallas (Triton) kernels of the chunked gated delta rule; the design is in ``triton.py``.

Notation per chunk (``C`` rows, ``gamma`` the chunk-local cumulative log decay, ``gamma_C`` its
last entry, ``D = exp(gamma_i - gamma_j)`` on ``j <= i``): ``P = (Q K^T) o D``,
``o = scale (diag(e^gamma) Q S_0 + P V_new)``, ``S_C = e^gamma_C S_0 + (diag(e^(gamma_C - gamma)) K)^T V_new``.
Derivatives of ``exp(gamma_i - gamma_j)`` give ``d gamma_i += sum_j M_ij``, ``d gamma_j -= sum_i M_ij``
with ``M = (gradient of the decayed matrix) o (the decayed matrix)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.gated_delta_rule import _kernel_math as km
from pallas_kernels.gated_delta_rule import _specs

_F32 = jnp.float32


def _backward_sweep_kernel(
    q_ref, k_ref, w_ref, scores_ref, gamma_ref, d_o_ref, d_final_ref,
    d_states_ref, d_v_new_ref, d_initial_ref, *, config,
):
    """Walk the chunks of one (batch, head, V block) in reverse, ``dS`` on chip.

    ``dV_new = scale P^T dO + e^(gamma_C - gamma) o (K dS)``;
    ``dS <- e^gamma_C dS + scale Q^T (e^gamma o dO) - W^T dV_new``.
    """
    chunk = config.chunk_size
    key_dim = k_ref.shape[-1]
    dot_dtype = k_ref.dtype
    num_chunks = k_ref.shape[0] // chunk

    def step(reverse_index, d_state):
        index = num_chunks - 1 - reverse_index
        rows = pl.ds(index * chunk, chunk)
        d_states_ref[pl.ds(index * key_dim, key_dim), :] = d_state.astype(d_states_ref.dtype)
        d_o = d_o_ref[rows, :]
        gamma = gamma_ref[rows]
        gamma_last = gamma_ref[index * chunk + chunk - 1]
        d_v_new = config.scale * km.dot(scores_ref[rows, :], d_o, dot_dtype, transpose_a=True)
        from_state = km.dot(k_ref[rows, :], d_state, dot_dtype)
        d_v_new = d_v_new + jnp.exp(gamma_last - gamma)[:, None] * from_state
        d_v_new_ref[rows, :] = d_v_new
        d_o_decayed = (config.scale * jnp.exp(gamma))[:, None] * d_o.astype(_F32)
        d_state = jnp.exp(gamma_last) * d_state
        d_state = d_state + km.dot(q_ref[rows, :], d_o_decayed, dot_dtype, transpose_a=True)
        return d_state - km.dot(w_ref[rows, :], d_v_new, dot_dtype, transpose_a=True)

    d_initial_ref[...] = jax.lax.fori_loop(0, num_chunks, step, d_final_ref[...])


def backward_sweep(q, k, w, scores, gamma, d_o, d_final, config):
    """Returns ``dS`` at every chunk end ``[B, H, N * K, V]`` (input dtype), ``dV_new [B, T, H, V]``
    (float32) and the gradient of the initial state ``[B, H, K, V]`` (float32)."""
    batch, length, heads, key_dim = k.shape
    value_dim = d_o.shape[-1]
    block = config.value_block
    rows = length // config.chunk_size * key_dim
    return _specs.call(
        functools.partial(_backward_sweep_kernel, config=config),
        grid=(value_dim // block, batch * heads),
        in_specs=[
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.state_spec(length, config.chunk_size, heads, 1),
            _specs.gate_spec(length, heads, 1),
            _specs.sequence_spec(length, block, heads, 1, column_axis=0),
            _specs.state_spec(key_dim, block, heads, 1, column_axis=0),
        ],
        out_specs=[
            _specs.state_spec(rows, block, heads, 1, column_axis=0),
            _specs.sequence_spec(length, block, heads, 1, column_axis=0),
            _specs.state_spec(key_dim, block, heads, 1, column_axis=0),
        ],
        out_shape=[
            _specs.shape_of((batch, heads, rows, value_dim), k.dtype),
            _specs.shape_of((batch, length, heads, value_dim), _F32),
            _specs.shape_of((batch, heads, key_dim, value_dim), _F32),
        ],
        config=config,
        name="backward_sweep",
        operand_dtype=k.dtype,
    )(q, k, w, scores, gamma, d_o, d_final)


def _chunk_gradients_kernel(
    q_ref, k_ref, v_new_ref, d_o_ref, d_v_new_ref, states_ref, d_states_ref, gamma_ref,
    d_q_ref, d_k_ref, d_w_ref, d_gamma_ref, *, config, key_dim,
):
    """One chunk, one K block: dq, dk (outside ``A``), ``dW = -dV_new S_0^T`` and d gamma."""
    chunk, block = config.chunk_size, config.value_block
    key_block = q_ref.shape[-1]
    index = pl.program_id(1)
    rows = pl.ds(index * chunk, chunk)
    state_rows = pl.ds(index * key_dim + pl.program_id(0) * key_block, key_block)
    dot_dtype = q_ref.dtype

    def value_block_products(column, carry):
        d_q_state, d_k_state, d_w, d_scores, state_term = carry
        columns = pl.ds(column * block, block)
        state, d_state = states_ref[state_rows, columns], d_states_ref[state_rows, columns]
        d_o, v_new = d_o_ref[rows, columns], v_new_ref[rows, columns]
        d_q_state += km.dot(d_o, state, dot_dtype, transpose_b=True)
        d_k_state += km.dot(v_new, d_state, dot_dtype, transpose_b=True)
        d_w -= km.dot(d_v_new_ref[rows, columns], state, dot_dtype, transpose_b=True)
        d_scores += km.dot(d_o, v_new, dot_dtype, transpose_b=True)
        state_term += km.total_sum(d_state.astype(_F32) * state.astype(_F32))
        return d_q_state, d_k_state, d_w, d_scores, state_term

    rectangle = jnp.zeros((chunk, key_block), _F32)
    initial = (rectangle, rectangle, rectangle, jnp.zeros((chunk, chunk), _F32), jnp.zeros((), _F32))
    d_q_state, d_k_state, d_w, d_scores, state_term = jax.lax.fori_loop(
        0, d_o_ref.shape[-1] // block, value_block_products, initial
    )
    q, k = q_ref[rows, :], k_ref[rows, :]
    gamma = gamma_ref[rows]
    gamma_last = gamma_ref[index * chunk + chunk - 1]
    d_scores = config.scale * d_scores * km.decay_matrix(gamma, gamma, "causal")
    q_decay, k_decay = jnp.exp(gamma), jnp.exp(gamma_last - gamma)
    d_q = config.scale * d_q_state * q_decay[:, None] + km.dot(d_scores, k, dot_dtype)
    d_q_ref[rows, :] = d_q.astype(d_q_ref.dtype)
    d_k = km.dot(d_scores, q, dot_dtype, transpose_a=True) + d_k_state * k_decay[:, None]
    d_k_ref[rows, :] = d_k
    d_w_ref[rows, :] = d_w
    decayed = d_scores * km.dot(q, k, dot_dtype, transpose_b=True)
    k_term = km.row_sum(d_k_state * k.astype(_F32)) * k_decay
    d_gamma = config.scale * km.row_sum(d_q_state * q.astype(_F32)) * q_decay
    d_gamma += km.row_sum(decayed) - jnp.sum(decayed, axis=0) - k_term
    last = jnp.sum(k_term) + jnp.exp(gamma_last) * state_term
    is_last = jax.lax.broadcasted_iota(jnp.int32, (chunk,), 0) == chunk - 1
    d_gamma_ref[rows] = d_gamma + jnp.where(is_last, last, 0.0)


def chunk_gradients(q, k, v_new, d_o, d_v_new, states, d_states, gamma, config):
    """Returns dq (input dtype), dk outside ``A`` and dW (float32 ``[B, T, H, K]``), and
    d gamma per K block ``[K / key_block, B, H, T]`` (float32, summed by the caller)."""
    batch, length, heads, key_dim = q.shape
    value_dim = v_new.shape[-1]
    key_block = config.key_block
    key_blocks = key_dim // key_block
    rows = length // config.chunk_size * key_dim
    kernel = functools.partial(_chunk_gradients_kernel, config=config, key_dim=key_dim)
    sequence = functools.partial(_specs.sequence_spec, length, heads=heads, bh_axis=2)
    return _specs.call(
        kernel,
        grid=(key_blocks, length // config.chunk_size, batch * heads),
        in_specs=[
            sequence(key_block, column_axis=0),
            sequence(key_block, column_axis=0),
            sequence(value_dim),
            sequence(value_dim),
            sequence(value_dim),
            _specs.state_spec(rows, value_dim, heads, 2),
            _specs.state_spec(rows, value_dim, heads, 2),
            _specs.gate_spec(length, heads, 2),
        ],
        out_specs=[
            sequence(key_block, column_axis=0),
            sequence(key_block, column_axis=0),
            sequence(key_block, column_axis=0),
            _specs.gate_spec(length, heads, 2, lead_axis=0),
        ],
        out_shape=[
            _specs.shape_of(q.shape, q.dtype),
            _specs.shape_of(q.shape, _F32),
            _specs.shape_of(q.shape, _F32),
            _specs.shape_of((key_blocks, batch, heads, length), _F32),
        ],
        config=config,
        name="chunk_gradients",
        operand_dtype=k.dtype,
    )(q, k, v_new, d_o, d_v_new, states, d_states, gamma)


def _ut_backward_kernel(
    k_ref, v_ref, beta_ref, gamma_ref, inverse_ref, w_ref, u_ref, d_w_ref, d_u_ref, d_k_direct_ref,
    d_k_ref, d_v_ref, d_beta_ref, d_gamma_ref, *, config,
):
    """One chunk: gradients through ``W = T X_w``, ``U~ = T X_u``, ``T = (I + A)^{-1}``.

    ``dX = T^T dW``; ``dT = dW X^T`` and ``dA = -T^T dT T^T`` combine to
    ``dA = -(dX_w W^T + dX_u U~^T)`` on the strict lower triangle. With ``G = dA o D``
    (``A = diag(beta) K K^T o D``): ``dK += diag(beta) G K + (diag(beta) G)^T K``,
    ``d beta += rowsum(G o K K^T)``, and ``M = dA o A`` feeds d gamma.
    """
    chunk, key_block, value_block = config.chunk_size, config.key_block, config.value_block
    rows = pl.ds(pl.program_id(0) * chunk, chunk)
    dot_dtype = k_ref.dtype
    inverse = inverse_ref[rows, :]
    beta, gamma = beta_ref[rows], gamma_ref[rows]
    k_scale = beta * jnp.exp(gamma)
    key_blocks = k_ref.shape[-1] // key_block

    def d_x_w(columns):  # T^T dW, one K block
        return km.dot(inverse, d_w_ref[rows, columns], dot_dtype, transpose_a=True)

    def key_pass(column, carry):
        d_a, kk, d_beta, d_gamma = carry
        columns = pl.ds(column * key_block, key_block)
        k, d_x = k_ref[rows, columns], d_x_w(columns)
        d_a += km.dot(d_x, w_ref[rows, columns], dot_dtype, transpose_b=True)
        kk += km.dot(k, k, dot_dtype, transpose_b=True)
        d_x_dot_k = km.row_sum(d_x * k.astype(_F32))  # X_w = diag(beta e^gamma) K
        return d_a, kk, d_beta + d_x_dot_k * jnp.exp(gamma), d_gamma + d_x_dot_k * k_scale

    def value_pass(column, carry):
        d_a, d_beta = carry
        columns = pl.ds(column * value_block, value_block)
        d_x_u = km.dot(inverse, d_u_ref[rows, columns], dot_dtype, transpose_a=True)
        d_a += km.dot(d_x_u, u_ref[rows, columns], dot_dtype, transpose_b=True)
        d_v_ref[rows, columns] = (beta[:, None] * d_x_u).astype(d_v_ref.dtype)
        return d_a, d_beta + km.row_sum(d_x_u * v_ref[rows, columns].astype(_F32))

    square, vector = jnp.zeros((chunk, chunk), _F32), jnp.zeros((chunk,), _F32)
    d_a, kk, d_beta, d_gamma = jax.lax.fori_loop(
        0, key_blocks, key_pass, (square, square, vector, vector)
    )
    d_a, d_beta = jax.lax.fori_loop(0, v_ref.shape[-1] // value_block, value_pass, (d_a, d_beta))
    grad_decayed = -d_a * km.decay_matrix(gamma, gamma, "strict")  # G = dA o D, strict lower
    decayed = grad_decayed * beta[:, None] * kk  # M = dA o A
    d_gamma_ref[rows] = d_gamma + km.row_sum(decayed) - jnp.sum(decayed, axis=0)
    d_beta_ref[rows] = d_beta + km.row_sum(grad_decayed * kk)
    beta_grad = beta[:, None] * grad_decayed

    def key_output(column, carry):
        columns = pl.ds(column * key_block, key_block)
        k = k_ref[rows, columns]
        d_k = d_k_direct_ref[rows, columns] + k_scale[:, None] * d_x_w(columns)
        d_k += km.dot(beta_grad, k, dot_dtype) + km.dot(beta_grad, k, dot_dtype, transpose_a=True)
        d_k_ref[rows, columns] = d_k.astype(d_k_ref.dtype)
        return carry

    jax.lax.fori_loop(0, key_blocks, key_output, 0)


def ut_backward(k, v, beta, gamma, inverse, w, u, d_w, d_u, d_k_direct, config):
    """Returns dk, dv (input dtypes) and d beta, d gamma through the UT transform (float32)."""
    batch, length, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    sequence = functools.partial(_specs.sequence_spec, length, heads=heads, bh_axis=1)
    gate = _specs.gate_spec(length, heads, 1)
    return _specs.call(
        functools.partial(_ut_backward_kernel, config=config),
        grid=(length // config.chunk_size, batch * heads),
        in_specs=[
            sequence(key_dim),
            sequence(value_dim),
            gate,
            gate,
            _specs.state_spec(length, config.chunk_size, heads, 1),
            sequence(key_dim),
            sequence(value_dim),
            sequence(key_dim),
            sequence(value_dim),
            sequence(key_dim),
        ],
        out_specs=[sequence(key_dim), sequence(value_dim), gate, gate],
        out_shape=[
            _specs.shape_of(k.shape, k.dtype),
            _specs.shape_of(v.shape, v.dtype),
            _specs.shape_of(beta.shape, _F32),
            _specs.shape_of(gamma.shape, _F32),
        ],
        config=config,
        name="ut_backward",
        operand_dtype=k.dtype,
    )(k, v, beta, gamma, inverse, w, u, d_w, d_u, d_k_direct)
