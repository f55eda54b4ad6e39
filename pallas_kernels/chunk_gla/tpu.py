"""Gated linear attention with a per-head decay as Pallas TPU (Mosaic) kernels: forward and backward.

Design. One program per (batch, head, chunk) on a grid whose chunk axis is "arbitrary"
(sequential on one TensorCore) and whose batch and head axes are "parallel" (split across cores).
The float32 state [K, V] lives in a VMEM scratch buffer carried from one chunk to the next, so it
never touches HBM; Pallas's pipeline prefetches chunk n + 1's q, k, v blocks while chunk n computes.
The backward walks the chunks in reverse (its index maps read chunk N - 1 - j) carrying dL/dS, and
reads the forward's per-chunk states (stored only when differentiating, in the input dtype) instead
of recomputing them. The same equations as triton.py (there: G_t = cumulative log decay within the
chunk, L = last token, D_ts = scale e^{G_t - G_s} for s <= t, masked to -inf before ``exp``):

    forward:  o = (q k^T * D) v + scale (q e^G) S_0,      S_C = e^{G_L} S_0 + (k e^{G_L - G})^T v
    backward: dv = (q k^T * D)^T do + (k e^{G_L - G}) dS_C
              dq = (do v^T * D) k + scale e^G (do S_0^T)
              dk = (do v^T * D)^T q + e^{G_L - G} (v dS_C^T)
              dS_0 = e^{G_L} dS_C + scale (q e^G)^T do

(dlog_decay is formed outside, as for the Triton kernels.) Every product is a 2-D MXU matmul with
float32 accumulation on operands in the input dtype.

Layouts (Mosaic blocks must have their last two dims divisible by (8, 128) or equal to the array's):
the wrapper moves heads before time, q, k [B, H, T, K], v [B, H, T, V], so a chunk is a [C, K] /
[C, V] block; the cumulative decays come twice, as a column [B, H, T, 1] (scaling rows) and as
rows [B, H, N, 1, C] (the s-axis of D), so the kernel never transposes a vector. K and V are whole
blocks (any width; lane-dense at multiples of 128). VMEM per program at C = 64, K = V = 128,
bfloat16: double-buffered q, k, v, o, do blocks (16 KiB each), the [K, V] state and stored state
(64 + 32 KiB) and [C, C] temporaries: well under 1 MiB.

Only the per-head (scalar) decay has a TPU kernel: a per-key-channel decay needs D per channel
([C, C, K]); ``chunk_gla`` runs that case through ``xla.py`` on TPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _common


def _dot(a, b, contract=(1, 0)):
    """float32-accumulated 2-D matmul contracting ``a``'s axis ``contract[0]`` with ``b``'s ``contract[1]``."""
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                               preferred_element_type=jnp.float32)


def _decay_matrix(cum_col, cum_row, scale):
    """``scale * e^{G_t - G_s}`` for s <= t, exact 0 above the diagonal: ``[C, C]`` from ``[C, 1]``, ``[1, C]``."""
    size = cum_col.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (size, size), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (size, size), 1)
    return scale * jnp.exp(jnp.where(rows >= cols, cum_col - cum_row, -jnp.inf))


def _forward_kernel(q_ref, k_ref, v_ref, cum_col_ref, cum_row_ref, initial_ref,  # inputs
                    o_ref, final_ref, *rest,  # outputs (+ stored states), then the state scratch
                    scale, store_states):
    states_ref, state_ref = (rest[0], rest[1]) if store_states else (None, rest[0])
    chunk, num_chunks = pl.program_id(2), pl.num_programs(2)

    @pl.when(chunk == 0)
    def _():
        state_ref[...] = initial_ref[...]

    dtype = q_ref.dtype
    state = state_ref[...]
    if store_states:
        states_ref[...] = state.astype(states_ref.dtype)
    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    cum, cum_row = cum_col_ref[...], cum_row_ref[...]
    last = cum[cum.shape[0] - 1:, :]  # [1, 1]
    scores = _dot(q, k, (1, 1)) * _decay_matrix(cum, cum_row, scale)
    inter = scale * _dot((q * jnp.exp(cum)).astype(dtype), state.astype(dtype))
    o_ref[...] = (inter + _dot(scores.astype(dtype), v)).astype(o_ref.dtype)
    k_to_end = (k * jnp.exp(last - cum)).astype(dtype)
    new_state = jnp.exp(last) * state + _dot(k_to_end, v, (0, 0))
    state_ref[...] = new_state

    @pl.when(chunk == num_chunks - 1)
    def _():
        final_ref[...] = new_state


def _to_kernel_layout(q, k, v, cum_decay, chunk_size):
    """Heads before time; the per-head cumulative decays ``[B, H, T]`` as a column and as chunk rows."""
    batch, heads, steps = cum_decay.shape
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    cum_col = cum_decay[..., None]
    cum_row = cum_decay.reshape(batch, heads, steps // chunk_size, 1, chunk_size)
    return q, k, v, cum_col, cum_row


def _sequence_spec(chunk_size, width, reverse=False):
    """Block of chunk n (or N-1-n when ``reverse``) of a ``[B, H, T, width]`` array."""
    def index(b, h, n):
        return (b, h, (pl.num_programs(2) - 1 - n) if reverse else n, 0)
    return pl.BlockSpec((None, None, chunk_size, width), index)


def _chunk_spec(shape_tail, reverse=False):
    """Block of chunk n (or N-1-n) of a ``[B, H, N, *shape_tail]`` array."""
    def index(b, h, n):
        return (b, h, (pl.num_programs(2) - 1 - n) if reverse else n) + (0,) * len(shape_tail)
    return pl.BlockSpec((None, None, None, *shape_tail), index)


def _state_spec(key_dim, value_dim):
    return pl.BlockSpec((None, None, key_dim, value_dim), lambda b, h, n: (b, h, 0, 0))


_PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def forward(q, k, v, cum_decay, initial_state, *, scale, chunk_size, store_states):
    """``(o, final_state, chunk_states or None)``: q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, per-head
    cumulative decays ``[B, H, T]`` (T a multiple of the chunk), states ``[B, H, K, V]`` float32;
    chunk states ``[B, H, N, K, V]`` in q's dtype."""
    if cum_decay.ndim != 3:
        raise ValueError("the TPU chunk_gla kernels take a per-head decay [B, H, T] only")
    batch, steps, heads, key_dim = q.shape
    value_dim, num_chunks = v.shape[-1], steps // chunk_size
    q, k, v, cum_col, cum_row = _to_kernel_layout(q, k, v, cum_decay, chunk_size)
    out_shape = [jax.ShapeDtypeStruct(v.shape, v.dtype),
                 jax.ShapeDtypeStruct((batch, heads, key_dim, value_dim), jnp.float32)]
    out_specs = [_sequence_spec(chunk_size, value_dim), _state_spec(key_dim, value_dim)]
    if store_states:
        out_shape.append(jax.ShapeDtypeStruct((batch, heads, num_chunks, key_dim, value_dim), q.dtype))
        out_specs.append(_chunk_spec((key_dim, value_dim)))
    outputs = pl.pallas_call(
        functools.partial(_forward_kernel, scale=scale, store_states=store_states),
        grid=(batch, heads, num_chunks),
        in_specs=[_sequence_spec(chunk_size, key_dim), _sequence_spec(chunk_size, key_dim),
                  _sequence_spec(chunk_size, value_dim), _sequence_spec(chunk_size, 1),
                  _chunk_spec((1, chunk_size)), _state_spec(key_dim, value_dim)],
        out_specs=out_specs,
        out_shape=tuple(out_shape),
        scratch_shapes=[pltpu.VMEM((key_dim, value_dim), jnp.float32)],
        interpret=_common.interpret_mode(),
        compiler_params=_PARAMS,
        name="chunk_gla_forward_tpu",
    )(q, k, v, cum_col, cum_row, initial_state)
    o = jnp.swapaxes(outputs[0], 1, 2)
    return o, outputs[1], (outputs[2] if store_states else None)


def _backward_kernel(q_ref, k_ref, v_ref, cum_col_ref, cum_row_ref, do_ref, states_ref, dfinal_ref,  # inputs
                     dq_ref, dk_ref, dv_ref, dinitial_ref,  # outputs
                     dstate_ref,  # scratch
                     *, scale):
    step, num_chunks = pl.program_id(2), pl.num_programs(2)

    @pl.when(step == 0)
    def _():
        dstate_ref[...] = dfinal_ref[...]

    dtype = q_ref.dtype
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    cum, cum_row = cum_col_ref[...], cum_row_ref[...]
    last = cum[cum.shape[0] - 1:, :]
    state, dstate = states_ref[...], dstate_ref[...]
    dstate_in = dstate.astype(dtype)
    decay = _decay_matrix(cum, cum_row, scale)
    scores = (_dot(q, k, (1, 1)) * decay).astype(dtype)
    dscores = (_dot(do, v, (1, 1)) * decay).astype(dtype)
    to_end = jnp.exp(last - cum)
    dq = scale * jnp.exp(cum) * _dot(do, state, (1, 1)) + _dot(dscores, k)
    dk = to_end * _dot(v, dstate_in, (1, 1)) + _dot(dscores, q, (0, 0))
    dv = _dot((k * to_end).astype(dtype), dstate_in) + _dot(scores, do, (0, 0))
    dq_ref[...], dk_ref[...], dv_ref[...] = dq, dk, dv.astype(dv_ref.dtype)
    q_decayed = (q * jnp.exp(cum)).astype(dtype)
    new_dstate = jnp.exp(last) * dstate + scale * _dot(q_decayed, do, (0, 0))
    dstate_ref[...] = new_dstate

    @pl.when(step == num_chunks - 1)
    def _():
        dinitial_ref[...] = new_dstate


def backward(q, k, v, cum_decay, do, chunk_states, dfinal, *, scale, chunk_size):
    """``(dq, dk float32, dv in v.dtype, dinitial float32)`` in the ``[B, T, H, ...]`` layouts of ``forward``."""
    batch, steps, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    q, k, v, cum_col, cum_row = _to_kernel_layout(q, k, v, cum_decay, chunk_size)
    do = jnp.swapaxes(do, 1, 2)
    seq = functools.partial(_sequence_spec, chunk_size, reverse=True)
    dq, dk, dv, dinitial = pl.pallas_call(
        functools.partial(_backward_kernel, scale=scale),
        grid=(batch, heads, steps // chunk_size),
        in_specs=[seq(key_dim), seq(key_dim), seq(value_dim), seq(1), _chunk_spec((1, chunk_size), reverse=True),
                  seq(value_dim), _chunk_spec((key_dim, value_dim), reverse=True), _state_spec(key_dim, value_dim)],
        out_specs=[seq(key_dim), seq(key_dim), seq(value_dim), _state_spec(key_dim, value_dim)],
        out_shape=(jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(k.shape, jnp.float32),
                   jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(dfinal.shape, jnp.float32)),
        scratch_shapes=[pltpu.VMEM((key_dim, value_dim), jnp.float32)],
        interpret=_common.interpret_mode(),
        compiler_params=_PARAMS,
        name="chunk_gla_backward_tpu",
    )(q, k, v, cum_col, cum_row, do, chunk_states, dfinal)
    dq, dk, dv = (jnp.swapaxes(x, 1, 2) for x in (dq, dk, dv))
    return dq, dk, dv, dinitial
