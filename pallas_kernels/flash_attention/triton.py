"""Flash attention over packed rows as Pallas Triton kernels: a forward and two backward kernels.

The visibility rule and outputs of ``reference.py``, computed block by block without the [T, T]
matrix (FlashAttention-2's schedule). Per (batch, head, query block of ``BQ`` rows), the forward
walks the key blocks that can hold a visible key (up to the diagonal when causal, back to the
window's start with a window), keeping the running row maximum ``m``, the running sum ``l`` and
the unnormalised output in registers:

    s = scale q k^T (masked to -inf),  m' = max(m, rowmax s),  p = e^{s - m'},
    l <- e^{m - m'} l + rowsum p,      acc <- e^{m - m'} acc + p v,      o = acc / l,  lse = m + log l

(``o = 0`` and ``lse = +inf`` for a query that sees nothing: a padding token). The backward
recomputes ``p = e^{s - lse}`` from the saved ``lse``: with ``delta = rowsum(do * o)`` (XLA),
``dp = do v^T``, ``ds = p (dp - delta)``, one kernel per query block accumulates ``dq = scale ds k``
over key blocks, one per key block accumulates ``dv = p^T do`` and ``dk = scale ds^T q`` over
query blocks. Matmul operands in the input dtype, float32 accumulation, statistics float32.

Layout ``[B, H, T, D]`` with T a multiple of the blocks and D a power of two >= 16 (the wrapper
in ``__init__.py`` pads: padded keys carry segment id 0 and are invisible, zero feature columns add
nothing); segment ids ``[B, T]`` int32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _common

NUM_WARPS = 4


def _dot(a, b, contract=(1, 0)):
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())), preferred_element_type=jnp.float32)


def _keep(q_seg, k_seg, q_first, k_first, block_q, block_k, causal, window):
    """Boolean ``[BQ, BK]``: which keys of the block each query may see."""
    q_index = q_first + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    k_index = k_first + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
    keep = (q_seg[:, None] == k_seg[None, :]) & (k_seg[None, :] != 0)
    if causal:
        keep &= q_index >= k_index
    if window is not None:
        keep &= q_index - k_index < window
    return keep


def _key_range(q_first, block_q, block_k, num_keys, causal, window):
    """``[lo, hi)`` of the key blocks a query block can see."""
    hi = jnp.minimum((q_first + block_q + block_k - 1) // block_k, num_keys // block_k) if causal \
        else num_keys // block_k
    lo = jnp.maximum(0, (q_first - window + 1) // block_k) if window is not None else 0
    return lo, hi


def _query_range(k_first, block_q, block_k, num_queries, causal, window):
    """``[lo, hi)`` of the query blocks that can see a key block."""
    lo = k_first // block_q if causal else 0
    hi = num_queries // block_q
    if window is not None:
        hi = jnp.minimum(hi, (k_first + block_k - 1 + window - 1) // block_q + 1)
    return lo, hi


def _scores(q, k, q_seg, k_seg, q_first, k_first, scale, causal, window):
    s = scale * _dot(q, k, (1, 1))
    keep = _keep(q_seg, k_seg, q_first, k_first, q.shape[0], k.shape[0], causal, window)
    return jnp.where(keep, s, -jnp.inf)


def _forward_kernel(q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, o_ref, lse_ref, *, scale, causal, window, block_k):
    block_q = q_ref.shape[0]
    q_first = pl.program_id(2) * block_q
    q, q_seg = q_ref[...], q_seg_ref[...]

    def body(j, carry):
        m, l, acc = carry
        keys = pl.ds(j * block_k, block_k)
        s = _scores(q, k_ref[keys, :], q_seg, k_seg_ref[keys], q_first, j * block_k, scale, causal, window)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe[:, None])
        alpha = jnp.exp(m - m_safe)
        acc = alpha[:, None] * acc + _dot(p.astype(v_ref.dtype), v_ref[keys, :])
        return m_new, alpha * l + jnp.sum(p, axis=1), acc

    lo, hi = _key_range(q_first, block_q, block_k, k_ref.shape[0], causal, window)
    init = (jnp.full((block_q,), -jnp.inf, jnp.float32), jnp.zeros((block_q,), jnp.float32),
            jnp.zeros(q_ref.shape, jnp.float32))
    m, l, acc = jax.lax.fori_loop(lo, hi, body, init)
    seen = l > 0
    o_ref[...] = (acc / jnp.where(seen, l, 1.0)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)


def _specs(block_q, seq_len, head_dim):
    q_block = pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, i: (b, h, i, 0))
    whole = pl.BlockSpec((None, None, seq_len, head_dim), lambda b, h, i: (b, h, 0, 0))
    row_block = pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))
    seg_block = pl.BlockSpec((None, block_q), lambda b, h, i: (b, i))
    seg_whole = pl.BlockSpec((None, seq_len), lambda b, h, i: (b, 0))
    return q_block, whole, row_block, seg_block, seg_whole


def forward(q, k, v, segment_ids, *, scale, causal, window, block_q, block_k):
    """``(o [B, H, T, D] in q.dtype, lse float32 [B, H, T])`` from padded inputs."""
    batch, heads, seq_len, head_dim = q.shape
    q_block, whole, row_block, seg_block, seg_whole = _specs(block_q, seq_len, head_dim)
    kernel = functools.partial(_forward_kernel, scale=scale, causal=causal, window=window, block_k=block_k)
    return pl.pallas_call(
        kernel,
        grid=(batch, heads, seq_len // block_q),
        in_specs=[q_block, whole, whole, seg_block, seg_whole],
        out_specs=[q_block, row_block],
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, seq_len), jnp.float32)),
        interpret=_common.interpret_mode(),
        compiler_params=pl_triton.CompilerParams(num_warps=NUM_WARPS, num_stages=2),
        name="flash_attention_forward",
    )(q, k, v, segment_ids, segment_ids)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref, k_seg_ref, dq_ref,
               *, scale, causal, window, block_k):
    block_q = q_ref.shape[0]
    q_first = pl.program_id(2) * block_q
    q, do, q_seg = q_ref[...], do_ref[...], q_seg_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]

    def body(j, dq):
        keys = pl.ds(j * block_k, block_k)
        k = k_ref[keys, :]
        p = jnp.exp(_scores(q, k, q_seg, k_seg_ref[keys], q_first, j * block_k, scale, causal, window) - lse[:, None])
        ds = p * (_dot(do, v_ref[keys, :], (1, 1)) - delta[:, None])
        return dq + scale * _dot(ds.astype(k.dtype), k)

    lo, hi = _key_range(q_first, block_q, block_k, k_ref.shape[0], causal, window)
    dq_ref[...] = jax.lax.fori_loop(lo, hi, body, jnp.zeros(q_ref.shape, jnp.float32))


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref, k_seg_ref, dk_ref, dv_ref,
                *, scale, causal, window, block_q):
    block_k = k_ref.shape[0]
    k_first = pl.program_id(2) * block_k
    k, v, k_seg = k_ref[...], v_ref[...], k_seg_ref[...]

    def body(i, grads):
        dk, dv = grads
        rows = pl.ds(i * block_q, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        s = _scores(q, k, q_seg_ref[rows], k_seg, i * block_q, k_first, scale, causal, window)
        p = jnp.exp(s - lse_ref[rows][:, None])
        dv = dv + _dot(p.astype(do.dtype), do, (0, 0))
        ds = p * (_dot(do, v, (1, 1)) - delta_ref[rows][:, None])
        return dk + scale * _dot(ds.astype(q.dtype), q, (0, 0)), dv

    lo, hi = _query_range(k_first, block_q, block_k, q_ref.shape[0], causal, window)
    zeros = jnp.zeros(k_ref.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk_ref[...], dv_ref[...] = dk, dv


def backward(q, k, v, segment_ids, o, lse, do, *, scale, causal, window, block_q, block_k):
    """``(dq, dk, dv)`` float32 from padded inputs and the forward's ``o`` and ``lse``."""
    batch, heads, seq_len, head_dim = q.shape
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    options = dict(scale=scale, causal=causal, window=window)
    params = pl_triton.CompilerParams(num_warps=NUM_WARPS, num_stages=1)
    q_block, whole, row_block, seg_block, seg_whole = _specs(block_q, seq_len, head_dim)
    row_whole = pl.BlockSpec((None, None, seq_len), lambda b, h, i: (b, h, 0))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, block_k=block_k, **options),
        grid=(batch, heads, seq_len // block_q),
        in_specs=[q_block, whole, whole, q_block, row_block, row_block, seg_block, seg_whole],
        out_specs=q_block,
        out_shape=jax.ShapeDtypeStruct(q.shape, jnp.float32),
        interpret=_common.interpret_mode(), compiler_params=params, name="flash_attention_dq",
    )(q, k, v, do, lse, delta, segment_ids, segment_ids)
    k_block, _, _, k_seg_block, _ = _specs(block_k, seq_len, head_dim)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=block_q, **options),
        grid=(batch, heads, seq_len // block_k),
        in_specs=[whole, k_block, k_block, whole, row_whole, row_whole, seg_whole, k_seg_block],
        out_specs=[k_block, k_block],
        out_shape=(jax.ShapeDtypeStruct(k.shape, jnp.float32), jax.ShapeDtypeStruct(v.shape, jnp.float32)),
        interpret=_common.interpret_mode(), compiler_params=params, name="flash_attention_dkv",
    )(q, k, v, do, lse, delta, segment_ids, segment_ids)
    return dq, dk, dv
