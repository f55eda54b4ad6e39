"""Gated linear attention as Pallas Triton kernels: a fused forward and a fused backward.

Design (why one sequential-over-chunks kernel per direction). Per chunk the work is a handful of
[C, K] x [K, V]-sized matmuls; the state is [K, V]. The forward runs one program per
(batch, head, V-block) that walks the chunks in order and keeps the float32 state in registers:
each chunk reads q, k, v and the cumulative log decays once, writes o once, and the state never
touches HBM. The two-kernel alternative (per-chunk states, then a chunk-parallel output kernel)
writes and re-reads every chunk state: 64 KiB per chunk and head in float32 at K = V = 128, more
than the chunk's q, k, v together (48 KiB in bfloat16). The price is parallelism: B * H * V / 64
programs (256 at B=8, H=16, V=128). Compiled offline for sm_90, the forward at 8 warps uses ~250
registers per thread without spills, so one program fits per SM and the grid runs in two waves
over 132 SMs; BLOCK_V = 32 at 4 warps (512 programs, two per SM) is the other configuration to
measure. The backward does the same in reverse time, one program per (batch, head) carrying
dL/dS; it reads the forward's chunk states instead of recomputing them (stored only when
differentiating, in the input dtype: the precision the forward's own inter-chunk matmul used).

Math per chunk (see xla.py): G_t = cumulative log decay within the chunk, L = last token,
A_ts = scale * sum_k q_tk k_sk e^{G_tk - G_sk} for s <= t, masked to -inf before ``exp``.

    forward:  o = A v + scale (q e^G) S_0,      S_C = e^{G_L} S_0 + (k e^{G_L - G})^T v
    backward: dv = A^T do + (k e^{G_L - G}) dS_C
              dq = (do v^T * D) k + scale e^G (do S_0^T)            (D = masked decays, scaled)
              dk = (do v^T * D)^T q + e^{G_L - G} (v dS_C^T)
              dS_0 = e^{G_L} dS_C + scale (q e^G)^T do
              dlog_decay_j = sum_{t >= j} (q_t dq_t - k_t dk_t) + sum_v (dS_final * S_final)

The last line is done outside the kernels (a reverse cumulative sum over time; per-head decays
also sum over K). Per-head decay: A is a masked matmul (tensor cores). Per-key-channel decay: A
needs e^{G_tk - G_sk} per channel, so A's columns are built one token s at a time from a [C, K]
tile (C^2 K work on CUDA cores) while the inter-chunk terms stay matmuls. Matmul operands are in
the input dtype with float32 accumulation; the carried states and dq, dk are float32.

Layouts: q, k [B, T, H, K]; v, o [B, T, H, V]; cumulative decays float32, [B, H, T] (per head) or
[B, T, H, K]; states [B, H, K, V]. T is a multiple of the chunk size and K, V powers of two >= 16
(``chunk_gla`` in ``__init__.py`` pads). Offsets are int32: every array below 2**31 elements.
Tiles are sized for K, V <= 128 (a [K, BV] state per program); larger K needs a K-split.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _common

BLOCK_V = 64
FORWARD_WARPS = 8
BACKWARD_WARPS = 8
# V-block of the backward by input itemsize. Compiled offline for sm_90 at K = V = 128, chunk 64,
# the float32 backward needs 240 KiB of shared memory at BV = 64 (over the H200's 227 KiB per
# block) and 184 KiB at BV = 32; bfloat16 needs 64 KiB at BV = 64.
BACKWARD_BLOCK_V = {2: 64, 4: 32}


def _dot(a, b, contract=(1, 0)):
    """float32-accumulated 2-D matmul contracting ``a``'s axis ``contract[0]`` with ``b``'s ``contract[1]``."""
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _causal(chunk_size: int):
    """``[C, 1] >= [1, C]`` token-index grids for masking (row t, column s)."""
    rows = jax.lax.broadcasted_iota(jnp.int32, (chunk_size, 1), 0)
    return rows, jax.lax.broadcasted_iota(jnp.int32, (1, chunk_size), 1)


def _load_decays(decay_ref, batch, head, first, chunk_size, vector_decay):
    """Cumulative log decays of one chunk ``[C, 1 or K]`` and of its last token ``[1, 1 or K]``."""
    if vector_decay:
        cum = decay_ref[batch, pl.ds(first, chunk_size), head, :]
        last = decay_ref[batch, pl.ds(first + chunk_size - 1, 1), head, :]
        return cum, last
    cum = decay_ref[batch, head, pl.ds(first, chunk_size)]
    last = decay_ref[batch, head, pl.ds(first + chunk_size - 1, 1)]
    return cum[:, None], last[:, None]


def _scalar_decay_matrix(cum, scale):
    """``scale * e^{G_t - G_s}`` for s <= t, exact 0 above the diagonal: ``[C, C]``."""
    rows, cols = _causal(cum.shape[0])
    return scale * jnp.exp(jnp.where(rows >= cols, cum - cum.reshape(1, -1), -jnp.inf))


def _column_decay(cum, cum_s, s):
    """``e^{G_t - G_s}`` per key channel for all t of the chunk (0 for t < s): ``[C, K]``."""
    rows, _ = _causal(cum.shape[0])
    return jnp.exp(jnp.where(rows >= s, cum - cum_s, -jnp.inf))


def _token_rows(refs, batch, head, token, columns):
    """Row ``token`` of each ``[B, T, H, D]`` ref as float32 ``[1, D]`` (``columns`` selects D)."""
    return [ref[batch, pl.ds(token, 1), head, cols].astype(jnp.float32) for ref, cols in zip(refs, columns)]


def _vector_intra_output(q, cum, k_ref, v_ref, decay_ref, batch, head, first, values, scale, block_v):
    """``A v`` for per-channel decays, one key token s (one column of A) at a time: ``[C, BV]``."""
    whole = slice(None)

    def column(s, acc):
        k_s, cum_s, v_s = _token_rows((k_ref, decay_ref, v_ref), batch, head, first + s, (whole, whole, values))
        score = scale * jnp.sum(q * k_s * _column_decay(cum, cum_s, s), axis=1, keepdims=True)
        return acc + score * v_s

    acc = jnp.zeros((q.shape[0], block_v), jnp.float32)
    return jax.lax.fori_loop(0, q.shape[0], column, acc)


def _vector_intra_grads(q, do, cum, k_ref, v_ref, decay_ref, batch, head, first, values, scale):
    """Intra-chunk parts of ``(dq, dk, dv)`` for per-channel decays, one key token s at a time
    (dq, dk: this V-block's share of the sum over V)."""
    whole = slice(None)
    rows, _ = _causal(q.shape[0])

    def column(s, grads):
        dq, dk, dv = grads
        k_s, cum_s, v_s = _token_rows((k_ref, decay_ref, v_ref), batch, head, first + s, (whole, whole, values))
        decay = _column_decay(cum, cum_s, s)  # [C, K], zero for t < s
        score = scale * jnp.sum(q * k_s * decay, axis=1, keepdims=True)  # A[:, s]
        dscore = scale * jnp.sum(do * v_s, axis=1, keepdims=True)  # scale * (do v^T)[:, s]
        is_s = rows == s
        dv = dv + jnp.where(is_s, jnp.sum(score * do, axis=0, keepdims=True), 0.0)
        dq = dq + dscore * k_s * decay
        dk = dk + jnp.where(is_s, jnp.sum(dscore * q * decay, axis=0, keepdims=True), 0.0)
        return dq, dk, dv

    zeros = (jnp.zeros_like(q), jnp.zeros_like(q), jnp.zeros_like(do))
    return jax.lax.fori_loop(0, q.shape[0], column, zeros)


def _forward_kernel(
    q_ref, k_ref, v_ref, decay_ref, initial_ref,  # inputs
    o_ref, final_ref, *states_ref,  # outputs; states_ref is empty unless the states are stored
    chunk_size, scale, vector_decay, block_v,
):
    batch, head = pl.program_id(0), pl.program_id(1)
    values = pl.ds(pl.program_id(2) * block_v, block_v)
    dtype = q_ref.dtype

    def chunk(n, state):
        first = n * chunk_size
        rows = pl.ds(first, chunk_size)
        q, k, v = q_ref[batch, rows, head, :], k_ref[batch, rows, head, :], v_ref[batch, rows, head, values]
        cum, last = _load_decays(decay_ref, batch, head, first, chunk_size, vector_decay)
        if states_ref:
            states_ref[0][batch, head, n, :, values] = state.astype(dtype)
        inter = scale * _dot((q * jnp.exp(cum)).astype(dtype), state.astype(dtype))
        if vector_decay:
            q32 = q.astype(jnp.float32)
            intra = _vector_intra_output(
                q32, cum, k_ref, v_ref, decay_ref, batch, head, first, values, scale, block_v
            )
        else:
            scores = _dot(q, k, (1, 1)) * _scalar_decay_matrix(cum, scale)
            intra = _dot(scores.astype(dtype), v)
        o_ref[batch, rows, head, values] = (inter + intra).astype(o_ref.dtype)
        k_to_end = (k * jnp.exp(last - cum)).astype(dtype)
        return jnp.exp(last).reshape(-1, 1) * state + _dot(k_to_end, v, (0, 0))

    state = initial_ref[batch, head, :, values]
    final_ref[batch, head, :, values] = jax.lax.fori_loop(0, q_ref.shape[1] // chunk_size, chunk, state)


def _check_int32_addressable(**arrays) -> None:
    """Triton offsets are int32: refuse arrays the kernels could not address."""
    for name, shape in arrays.items():
        if math.prod(shape) >= 2**31:
            raise ValueError(f"{name} of shape {tuple(shape)} has >= 2**31 elements; split the batch")


def forward(
    q, k, v, cum_decay, initial_state, *, scale, chunk_size, store_states, block_v=None, num_warps=None
):
    """``(o, final_state, chunk_states or None)`` from padded inputs (layouts in the module docstring)."""
    batch, steps, heads, key_dim = q.shape
    states_shape = (batch, heads, steps // chunk_size, key_dim, v.shape[-1])
    _check_int32_addressable(q=q.shape, v=v.shape, chunk_states=states_shape if store_states else (0,))
    value_dim = v.shape[-1]
    block_v = min(block_v or BLOCK_V, value_dim)
    num_warps = num_warps or FORWARD_WARPS
    vector_decay = cum_decay.ndim == 4
    state_shape = (batch, heads, key_dim, value_dim)
    out_shapes = [jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(state_shape, jnp.float32)]
    if store_states:
        chunk_states = (batch, heads, steps // chunk_size, key_dim, value_dim)
        out_shapes.append(jax.ShapeDtypeStruct(chunk_states, q.dtype))
    kernel = functools.partial(
        _forward_kernel, chunk_size=chunk_size, scale=scale, vector_decay=vector_decay, block_v=block_v
    )
    outputs = pl.pallas_call(
        kernel,
        grid=(batch, heads, value_dim // block_v),
        out_shape=tuple(out_shapes),
        interpret=_common.interpret_mode(),
        compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=2),
        name="chunk_gla_forward",
    )(q, k, v, cum_decay, initial_state)
    return outputs[0], outputs[1], (outputs[2] if store_states else None)


def _scalar_intra_grads(q, k, v, do, cum, scale):
    """Intra-chunk parts of ``(dq, dk, dv)`` for a per-head decay: masked matmuls."""
    dtype = q.dtype
    decay = _scalar_decay_matrix(cum, scale)
    scores = _dot(q, k, (1, 1)) * decay  # A
    dscores = _dot(do, v, (1, 1)) * decay  # (do v^T) * D
    dq = _dot(dscores.astype(dtype), k)
    dk = _dot(dscores.astype(dtype), q, (0, 0))
    dv = _dot(scores.astype(dtype), do, (0, 0))
    return dq, dk, dv


def _backward_kernel(
    q_ref, k_ref, v_ref, decay_ref, do_ref, states_ref, dfinal_ref,  # inputs
    dq_ref, dk_ref, dv_ref, dinitial_ref,  # outputs; dq, dk: one partial sum per V-block
    *, chunk_size, scale, vector_decay, block_v,
):
    batch, head, value_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    values = pl.ds(value_block * block_v, block_v)
    num_chunks = q_ref.shape[1] // chunk_size
    dtype = q_ref.dtype

    def chunk(j, dstate):
        n = num_chunks - 1 - j
        first = n * chunk_size
        rows = pl.ds(first, chunk_size)
        q, k = q_ref[batch, rows, head, :], k_ref[batch, rows, head, :]
        v, do = v_ref[batch, rows, head, values], do_ref[batch, rows, head, values]
        cum, last = _load_decays(decay_ref, batch, head, first, chunk_size, vector_decay)
        state = states_ref[batch, head, n, :, values]
        q_decayed = (q * jnp.exp(cum)).astype(dtype)
        k_to_end = k * jnp.exp(last - cum)
        dq = scale * jnp.exp(cum) * _dot(do, state, (1, 1))
        dk = jnp.exp(last - cum) * _dot(v, dstate.astype(dtype), (1, 1))
        dv = _dot(k_to_end.astype(dtype), dstate.astype(dtype))
        if vector_decay:
            q32, do32 = q.astype(jnp.float32), do.astype(jnp.float32)
            intra = _vector_intra_grads(q32, do32, cum, k_ref, v_ref, decay_ref, batch, head, first, values, scale)
        else:
            intra = _scalar_intra_grads(q, k, v, do, cum, scale)
        dq_ref[value_block, batch, rows, head, :] = dq + intra[0]
        dk_ref[value_block, batch, rows, head, :] = dk + intra[1]
        dv_ref[batch, rows, head, values] = (dv + intra[2]).astype(dv_ref.dtype)
        return jnp.exp(last).reshape(-1, 1) * dstate + scale * _dot(q_decayed, do, (0, 0))

    dstate = jax.lax.fori_loop(0, num_chunks, chunk, dfinal_ref[batch, head, :, values])
    dinitial_ref[batch, head, :, values] = dstate


def backward(q, k, v, cum_decay, do, chunk_states, dfinal, *, scale, chunk_size, block_v=None, num_warps=None):
    """``(dq, dk float32, dv in v.dtype, dinitial float32)`` from padded inputs and forward states.

    Programs split V into blocks (more programs, half the [K, V] tiles per program at V = 128);
    dq and dk sum over V, so each block writes its partial sum and XLA adds them.
    """
    batch, _, heads, _ = q.shape
    value_dim = v.shape[-1]
    block_v = min(block_v or BACKWARD_BLOCK_V.get(jnp.dtype(q.dtype).itemsize, 32), value_dim)
    num_value_blocks = value_dim // block_v
    kernel = functools.partial(
        _backward_kernel, chunk_size=chunk_size, scale=scale, vector_decay=cum_decay.ndim == 4, block_v=block_v
    )
    out_shapes = (
        jax.ShapeDtypeStruct((num_value_blocks,) + q.shape, jnp.float32),
        jax.ShapeDtypeStruct((num_value_blocks,) + k.shape, jnp.float32),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(dfinal.shape, jnp.float32),
    )
    dq, dk, dv, dinitial = pl.pallas_call(
        kernel,
        grid=(batch, heads, num_value_blocks),
        out_shape=out_shapes,
        interpret=_common.interpret_mode(),
        compiler_params=pl_triton.CompilerParams(num_warps=num_warps or BACKWARD_WARPS, num_stages=1),
        name="chunk_gla_backward",
    )(q, k, v, cum_decay, do, chunk_states, dfinal)
    return jnp.sum(dq, axis=0), jnp.sum(dk, axis=0), dv, dinitial
