"""Attention over packed rows on TPU without the ``[B, H, T, T]`` scores: splash attention.

``jax.experimental.pallas.ops.tpu.splash_attention`` computes softmax attention block by block (flash
attention's online softmax) and skips the blocks a static mask rules out. Document masking comes
from segment ids, which it ands with the static mask; the rule of ``seqmodels.layers.attention``

    visible(q, k) = seg_k != 0  and  seg_k == seg_q  and  pos_k <= pos_q  and  pos_q - pos_k < window

becomes ``seg_k == seg_q`` (segment ids) and a static mask over row indices: ``CausalMask`` (full
context), ``LocalMask`` with ``window - 1`` keys to the left (``swa``) or ``FullMask``
(bidirectional). The two agree because the packer writes each document as one contiguous run of
its segment id with positions restarting at 0: within a segment, differences of row indices are
differences of positions. Two departures, both harmless to training: a padding query (segment 0)
attends to the other padding tokens instead of to nothing (its output is loss-masked and no real
token sees a padding key), and attention sinks (``swa.num_sinks > 0``: the first tokens of each
document, wherever it starts in the row) are not a static mask, so ``implementation: auto`` sends
those layers to the banded form (``banded.py``).

Memory is O(T) per head: the kernel keeps [block_q, block_kv] tiles in VMEM and saves only the
per-query log-sum-exp for its backward. Queries are scaled by ``D ** -0.5`` before the kernel (the
scale ``jax.nn.dot_product_attention`` applies); grouped key/value heads are repeated to the query
heads. The kernel runs per batch row (``vmap``) and, under a mesh, per shard (``shard_map`` over
batch and heads; Mosaic kernels cannot be partitioned by XLA). Off TPU it runs in Pallas's
interpret mode (tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from seqmodels.sharding import kernel_spec

BLOCK_CHOICES = (512, 256, 128)


def supports(seq_len: int, num_sinks: int) -> bool:
    """Whether splash attention computes the visibility rule for rows of ``seq_len`` tokens."""
    return num_sinks == 0 and seq_len % BLOCK_CHOICES[-1] == 0


def _block_sizes(seq_len: int) -> splash.BlockSizes:
    block = next(b for b in BLOCK_CHOICES if seq_len % b == 0)
    return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                             block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)


def _static_mask(seq_len: int, window: int | None, causal: bool):
    shape = (seq_len, seq_len)
    if not causal:
        return splash.FullMask(shape)
    if window is None:
        return splash.CausalMask(shape)
    return splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)


def _attend_local(q, k, v, segment_ids, *, window, causal, interpret):
    """Per shard: q, k, v ``[B, H, T, D]`` (k, v already repeated to H heads), segments ``[B, T]``."""
    heads, seq_len = q.shape[1], q.shape[2]
    mask = splash.MultiHeadMask([_static_mask(seq_len, window, causal)] * heads)
    kernel = splash.make_splash_mha(mask, block_sizes=_block_sizes(seq_len), head_shards=1, q_seq_shards=1,
                                    interpret=interpret)
    per_row = lambda q_row, k_row, v_row, seg: kernel(q_row, k_row, v_row, segment_ids=splash.SegmentIds(seg, seg))
    return jax.vmap(per_row)(q, k, v, segment_ids)


def splash_attention(q, k, v, segment_ids, *, window: int | None, causal: bool = True,
                     interpret: bool = False) -> jax.Array:
    """Attention ``[B, T, H, D]`` of ``q [B, T, H, D]`` over ``k, v [B, T, Hkv, D]`` within segments ``[B, T]``.

    ``window``: keys a query sees, itself included (None: full context); ``causal=False``: every key
    of the query's segment. T must be a multiple of 128 (``supports``).
    """
    batch, seq_len, heads, head_dim = q.shape
    if seq_len % BLOCK_CHOICES[-1]:
        raise ValueError(f"splash attention needs the sequence length to be a multiple of {BLOCK_CHOICES[-1]}, "
                         f"got {seq_len}; use model.attention.implementation=xla")
    if heads % k.shape[2]:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({k.shape[2]})")
    repeat = heads // k.shape[2]
    q = (q * head_dim ** -0.5).astype(q.dtype)
    k, v = (jnp.repeat(x, repeat, axis=2) if repeat > 1 else x for x in (k, v))
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, H, T, D]
    segment_ids = segment_ids.astype(jnp.int32)
    local = functools.partial(_attend_local, window=window, causal=causal, interpret=interpret)
    spec = kernel_spec(("batch", "heads", None, None), q.shape)
    if spec is not None:
        rows = jax.sharding.PartitionSpec(spec[0], None)
        local = jax.shard_map(local, in_specs=(spec, spec, spec, rows), out_specs=spec, check_vma=False)
    return jnp.swapaxes(local(q, k, v, segment_ids), 1, 2)
