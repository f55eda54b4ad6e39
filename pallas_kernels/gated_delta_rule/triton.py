"""Pallas (Triton backend) kernels for the chunked gated delta rule, forward and backward.

The math is the WY / UT-transform form derived in ``xla.py`` (chunk ``C``, cumulative log decay
``gamma`` restarted every chunk, ``T = (I + A)^{-1}``, ``W = T diag(beta e^gamma) K``,
``U~ = T diag(beta) V``, ``V_new = U~ - W S_0``). Design, per call:

Forward (two kernels)
  1. ``prepare`` -- grid ``(chunks, B*H)``, fully parallel. Builds ``A`` in 16x16 blocks,
     inverts the diagonal blocks by forward substitution in registers, fills the blocks below
     by block forward substitution, and writes ``W``, ``U~`` and the decayed causal scores
     ``P = (Q K^T) o D`` (and, for the backward, ``T``). Everything that does not depend on
     the state leaves the sequential kernel.
  2. ``forward sweep`` -- grid ``(V / value_block, B*H)``; each program walks the chunks in order
     with its ``[K, value_block]`` float32 state slice on chip (``fori_loop``), computing
     ``V_new = U~ - W S``, ``o = scale (e^gamma o (Q S) + P V_new)`` and the next state
     ``e^gamma_C S + K^T (e^(gamma_C - gamma) o V_new)``: four matmuls per chunk. Nothing per
     chunk is written except ``o``, unless the backward asks for the chunk-start states and
     ``V_new``.

Backward (the residuals are only the inputs; everything else is recomputed)
  1. ``prepare`` again (with ``T``), and the forward sweep in "states" mode: chunk-start states
     ``S_c`` and ``V_new``.
  2. ``backward sweep`` (``triton_backward.py``) -- the reverse walk over chunks carrying
     ``dS`` (gradient of the state at the chunk's end) on chip: stores ``dS`` per chunk and
     ``dV_new = scale P^T dO + diag(e^(gamma_C - gamma)) K dS``, and updates
     ``dS <- e^gamma_C dS + scale (diag(e^gamma) Q)^T dO - W^T dV_new``; the last value is the
     gradient of the initial state.
  3. ``chunk gradients`` -- grid ``(K / key_block, chunks, B*H)``, parallel: dq, the part of dk
     that does not go through ``A``, ``dW = -dV_new S_c^T`` and the gamma gradient of the
     output/state terms, looping over V blocks.
  4. ``UT backward`` -- grid ``(chunks, B*H)``, parallel: with ``dX_w = T^T dW``,
     ``dX_u = T^T dV_new`` and ``dA = -(dX_w W^T + dX_u U~^T)`` (strictly lower), the gradients
     of k, v, beta and gamma through the UT transform.
  The chunk-local cumsum of the log decay, the padding and the layout changes are plain JAX
  around a ``custom_vjp``, so their gradients come from autodiff.

Precision: matmul operands are in the input dtype (bf16 on the tensor cores; float32 inputs as
TF32 on the GPU, exact in the interpreter) and accumulate in float32; ``T`` is built in IEEE
float32; the carried state and the gradients of the gates are float32. What is stored only to
be a matmul operand later (``W``, ``U~``, ``T``, the scores, the chunk states, ``V_new``) is
stored in the input dtype; ``dV_new`` and the partial gradients are float32. Every exponent is
a difference of cumulative log decays with ``j <= i`` (<= 0), or ``gamma`` itself; masked
entries are set to ``-inf`` before ``exp``.

Launch settings (``_specs.LAUNCH``) were chosen from ptxas reports without a GPU
(``benchmarks/gated_delta_rule_ptxas.py``); timings come from ``benchmarks/kernels.py --ops gated_delta_rule``
on the GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.gated_delta_rule import _kernel_math as km
from pallas_kernels.gated_delta_rule import _specs
from pallas_kernels.gated_delta_rule import triton_backward
from pallas_kernels._chunks import chunk_local_cumsum, pad_time
from pallas_kernels.gated_delta_rule._specs import KernelConfig

_F32 = jnp.float32
_BLOCK = km.DIAGONAL_BLOCK


def _prepare_kernel(
    q_ref, k_ref, v_ref, beta_ref, gamma_ref, w_ref, u_ref, scores_ref, *inverse_ref, chunk_size
):
    """One chunk: ``W = T diag(beta e^gamma) K``, ``U~ = T diag(beta) V``, the decayed causal
    scores ``P = (Q K^T) o D`` (and ``T`` itself)."""
    start = pl.program_id(0) * chunk_size
    dot_dtype = k_ref.dtype
    chunk_rows = pl.ds(start, chunk_size)
    gamma = gamma_ref[chunk_rows]
    scores = km.dot(q_ref[chunk_rows, :], k_ref[chunk_rows, :], dot_dtype, transpose_b=True)
    scores_ref[chunk_rows, :] = (scores * km.decay_matrix(gamma, gamma, "causal")).astype(
        scores_ref.dtype
    )
    count = chunk_size // _BLOCK
    rows = [pl.ds(start + i * _BLOCK, _BLOCK) for i in range(count)]
    k_blocks = [k_ref[r, :] for r in rows]
    beta_blocks = [beta_ref[r] for r in rows]
    gamma_blocks = [gamma_ref[r] for r in rows]
    inverse = km.ut_inverse_blocks(k_blocks, beta_blocks, gamma_blocks, dot_dtype)
    x_w = [(b * jnp.exp(g))[:, None] * k for b, g, k in zip(beta_blocks, gamma_blocks, k_blocks)]
    x_u = [b[:, None] * v_ref[r, :] for b, r in zip(beta_blocks, rows)]
    for i in range(count):
        w_block = sum(km.dot(inverse[i, j], x_w[j], dot_dtype) for j in range(i + 1))
        u_block = sum(km.dot(inverse[i, j], x_u[j], dot_dtype) for j in range(i + 1))
        w_ref[rows[i], :] = w_block.astype(w_ref.dtype)
        u_ref[rows[i], :] = u_block.astype(u_ref.dtype)
        if inverse_ref:
            for j in range(count):
                block = inverse[i, j] if j <= i else jnp.zeros((_BLOCK, _BLOCK), _F32)
                inverse_ref[0][rows[i], pl.ds(j * _BLOCK, _BLOCK)] = block.astype(dot_dtype)


def prepare(q, k, v, beta, gamma, config: KernelConfig, *, emit_inverse: bool):
    """``W [B, T, H, K]``, ``U~ [B, T, H, V]``, scores ``P [B, H, T, C]`` (and with
    ``emit_inverse`` ``T [B, H, T, C]``), all in the input dtype: the matmul operand dtype."""
    batch, length, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    chunk = config.chunk_size
    out_shape = [
        _specs.shape_of(k.shape, k.dtype),
        _specs.shape_of(v.shape, k.dtype),
        _specs.shape_of((batch, heads, length, chunk), k.dtype),
    ]
    out_specs = [
        _specs.sequence_spec(length, key_dim, heads, 1),
        _specs.sequence_spec(length, value_dim, heads, 1),
        _specs.state_spec(length, chunk, heads, 1),
    ]
    if emit_inverse:
        out_shape.append(_specs.shape_of((batch, heads, length, chunk), k.dtype))
        out_specs.append(_specs.state_spec(length, chunk, heads, 1))
    return _specs.call(
        functools.partial(_prepare_kernel, chunk_size=chunk),
        grid=(length // chunk, batch * heads),
        in_specs=[
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.sequence_spec(length, value_dim, heads, 1),
            _specs.gate_spec(length, heads, 1),
            _specs.gate_spec(length, heads, 1),
        ],
        out_specs=out_specs,
        out_shape=out_shape,
        config=config,
        name="prepare",
        operand_dtype=k.dtype,
    )(q, k, v, beta, gamma)


def _forward_sweep_kernel(
    q_ref, k_ref, w_ref, u_ref, scores_ref, gamma_ref, initial_ref, *out_refs,
    config, emit_output, emit_states,
):
    """Walk the chunks of one (batch, head, V block) in order, the state slice on chip.

    Decays are applied to rows of ``[C, V block]`` results, not to the ``[C, K]`` operands:
    ``diag(e^gamma) Q S = e^gamma o (Q S)`` and ``(diag(e^(gamma_C - gamma)) K)^T V_new =
    K^T (e^(gamma_C - gamma) o V_new)``.
    """
    chunk = config.chunk_size
    key_dim = k_ref.shape[-1]
    dot_dtype = k_ref.dtype
    out_refs = list(out_refs)
    o_ref = out_refs.pop(0) if emit_output else None
    final_ref = out_refs.pop(0)
    states_ref, v_new_ref = out_refs if emit_states else (None, None)

    def step(index, state):
        rows = pl.ds(index * chunk, chunk)
        gamma = gamma_ref[rows]
        gamma_last = gamma_ref[index * chunk + chunk - 1]
        if emit_states:
            states_ref[pl.ds(index * key_dim, key_dim), :] = state.astype(states_ref.dtype)
        v_new = u_ref[rows, :].astype(_F32) - km.dot(w_ref[rows, :], state, dot_dtype)
        if emit_states:
            v_new_ref[rows, :] = v_new.astype(v_new_ref.dtype)
        if emit_output:
            from_state = jnp.exp(gamma)[:, None] * km.dot(q_ref[rows, :], state, dot_dtype)
            o = from_state + km.dot(scores_ref[rows, :], v_new, dot_dtype)
            o_ref[rows, :] = (config.scale * o).astype(o_ref.dtype)
        v_decayed = jnp.exp(gamma_last - gamma)[:, None] * v_new
        added = km.dot(k_ref[rows, :], v_decayed, dot_dtype, transpose_a=True)
        return jnp.exp(gamma_last) * state + added

    num_chunks = k_ref.shape[0] // chunk
    final_ref[...] = jax.lax.fori_loop(0, num_chunks, step, initial_ref[...].astype(_F32))


def forward_sweep(q, k, w, u, scores, gamma, initial_state, config, *, emit_output, emit_states):
    """Outputs, in order: ``o`` (if ``emit_output``), the final state (float32), and with
    ``emit_states`` the chunk-start states ``[B, H, N * K, V]`` and ``V_new [B, T, H, V]``."""
    batch, length, heads, key_dim = k.shape
    value_dim = u.shape[-1]
    block = config.value_block
    out_shape, out_specs = [], []
    if emit_output:
        out_shape.append(_specs.shape_of((batch, length, heads, value_dim), q.dtype))
        out_specs.append(_specs.sequence_spec(length, block, heads, 1, column_axis=0))
    out_shape.append(_specs.shape_of((batch, heads, key_dim, value_dim), _F32))
    out_specs.append(_specs.state_spec(key_dim, block, heads, 1, column_axis=0))
    if emit_states:
        rows = length // config.chunk_size * key_dim
        out_shape.append(_specs.shape_of((batch, heads, rows, value_dim), k.dtype))
        out_specs.append(_specs.state_spec(rows, block, heads, 1, column_axis=0))
        out_shape.append(_specs.shape_of((batch, length, heads, value_dim), k.dtype))
        out_specs.append(_specs.sequence_spec(length, block, heads, 1, column_axis=0))
    kernel = functools.partial(
        _forward_sweep_kernel, config=config, emit_output=emit_output, emit_states=emit_states
    )
    return _specs.call(
        kernel,
        grid=(value_dim // block, batch * heads),
        in_specs=[
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.sequence_spec(length, key_dim, heads, 1),
            _specs.sequence_spec(length, block, heads, 1, column_axis=0),
            _specs.state_spec(length, config.chunk_size, heads, 1),
            _specs.gate_spec(length, heads, 1),
            _specs.state_spec(key_dim, block, heads, 1, column_axis=0),
        ],
        out_specs=out_specs,
        out_shape=out_shape,
        config=config,
        name="forward_sweep",
        operand_dtype=k.dtype,
    )(q, k, w, u, scores, gamma, initial_state)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def chunked_gated_delta_rule(q, k, v, beta, gamma, initial_state, config: KernelConfig):
    """Kernel-layout entry: q, k ``[B, T, H, K]``, v ``[B, T, H, V]`` with ``T`` a multiple of the
    chunk; beta and the chunk-local cumulative log decay ``gamma`` ``[B, H, T]`` float32;
    ``initial_state [B, H, K, V]`` float32. Returns ``(o, final_state float32)``."""
    w, u, scores = prepare(q, k, v, beta, gamma, config, emit_inverse=False)
    o, final_state = forward_sweep(
        q, k, w, u, scores, gamma, initial_state, config, emit_output=True, emit_states=False
    )
    return o, final_state


def _chunked_forward(q, k, v, beta, gamma, initial_state, config):
    outputs = chunked_gated_delta_rule(q, k, v, beta, gamma, initial_state, config)
    return outputs, (q, k, v, beta, gamma, initial_state)


def _chunked_backward(config, residuals, cotangents):
    q, k, v, beta, gamma, initial_state = residuals
    d_o, d_final = cotangents
    w, u, scores, inverse = prepare(q, k, v, beta, gamma, config, emit_inverse=True)
    _, states, v_new = forward_sweep(
        q, k, w, u, scores, gamma, initial_state, config, emit_output=False, emit_states=True
    )
    d_states, d_v_new, d_initial = triton_backward.backward_sweep(
        q, k, w, scores, gamma, d_o.astype(q.dtype), d_final.astype(_F32), config
    )
    d_q, d_k_direct, d_w, d_gamma_direct = triton_backward.chunk_gradients(
        q, k, v_new, d_o.astype(q.dtype), d_v_new, states, d_states, gamma, config
    )
    d_k, d_v, d_beta, d_gamma = triton_backward.ut_backward(
        k, v, beta, gamma, inverse, w, u, d_w, d_v_new, d_k_direct, config
    )
    d_gamma = d_gamma + jnp.sum(d_gamma_direct, axis=0)
    return d_q, d_k, d_v.astype(v.dtype), d_beta, d_gamma, d_initial


chunked_gated_delta_rule.defvjp(_chunked_forward, _chunked_backward)


def _next_power_of_two(size: int) -> int:
    return max(16, 1 << (size - 1).bit_length())


def _pad_last(x, size):
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


def gated_delta_rule_pallas(
    q, k, v, beta, log_decay=None, *, scale, initial_state=None, chunk_size=64, interpret=False
):
    """Caller-layout entry (shapes as ``reference.py``); returns ``(o, final_state float32)``.

    Pads time to a multiple of the chunk (inert tokens), K and V to powers of two >= 16 (zero
    columns: zero keys/queries add nothing, zero values give zero outputs), builds the chunk-local
    cumulative log decay, and slices the results back.
    """
    batch, length, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    key_pad, value_pad = _next_power_of_two(key_dim), _next_power_of_two(value_dim)
    q, k = (_pad_last(pad_time(x, chunk_size), key_pad) for x in (q, k))
    v = _pad_last(pad_time(v, chunk_size), value_pad)
    beta = jnp.swapaxes(pad_time(beta.astype(_F32), chunk_size), 1, 2)
    if log_decay is None:
        gamma = jnp.zeros_like(beta)
    else:
        gamma = chunk_local_cumsum(pad_time(log_decay, chunk_size), chunk_size)
        gamma = jnp.swapaxes(gamma, 1, 2)
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, key_pad, value_pad), _F32)
    else:
        initial_state = initial_state.astype(_F32)
        initial_state = jnp.pad(
            initial_state, [(0, 0), (0, 0), (0, key_pad - key_dim), (0, value_pad - value_dim)]
        )
    config = KernelConfig(
        scale=float(scale),
        chunk_size=chunk_size,
        key_block=min(64, key_pad),
        value_block=min(64, value_pad),
        interpret=interpret,
    )
    o, final_state = chunked_gated_delta_rule(q, k, v, beta, gamma, initial_state, config)
    return o[:, :length, :, :value_dim], final_state[:, :, :key_dim, :value_dim]
