"""Softmax attention over packed rows (segment ids, causal, sliding window) without a [T, T] matrix.

    visible(t, s) = seg_s != 0 and seg_s == seg_t and (s <= t if causal) and (t - s < window if window)
    o_t = sum_{visible s} softmax_s(scale q_t . k_s) v_s            (0 where nothing is visible)

``q, k, v: [B, T, H, D]`` (key/value heads already repeated to the query heads), ``segment_ids:
[B, T]`` ints, 0 marking padding; each document must be one contiguous run of its id (row indices
then order a document's tokens as its positions do). ``scale`` defaults to ``D ** -0.5``.

Implementations (``impl``): ``reference`` (explicit mask, ``reference.py``), ``pallas`` /
``pallas_triton`` (FlashAttention-2 forward and backward Triton kernels, ``triton.py``, wired here
with ``jax.custom_vjp``); ``auto`` is the Triton kernels on GPU and ``reference`` elsewhere (on TPU
the project uses splash attention, ``seqmodels.layers.splash``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import _common
from pallas_kernels._chunks import pad_time
from pallas_kernels.flash_attention import reference, triton

__all__ = ["flash_attention"]

KERNELS = ("pallas_triton",)


def _check(q, k, v, segment_ids, window, block_size) -> None:
    batch, steps, heads, _ = _common.check_qkv(q, k, v)
    _common.check_shape("v", v, q.shape, "[B, T, H, D] (the shape of q)")
    if not jnp.issubdtype(getattr(segment_ids, "dtype", jnp.float32), jnp.integer):
        raise ValueError(f"segment_ids must be an integer array, got dtype {getattr(segment_ids, 'dtype', None)}")
    _common.check_shape("segment_ids", segment_ids, (batch, steps), "[B, T]")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or a positive int, got {window!r}")
    _common.check_chunk_size(block_size)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _kernel(q, k, v, segment_ids, scale, causal, window, block_size):
    return triton.forward(q, k, v, segment_ids, scale=scale, causal=causal, window=window, block_q=block_size,
                          block_k=block_size)[0]


def _kernel_fwd(q, k, v, segment_ids, scale, causal, window, block_size):
    o, lse = triton.forward(q, k, v, segment_ids, scale=scale, causal=causal, window=window, block_q=block_size,
                            block_k=block_size)
    return o, (q, k, v, segment_ids, o, lse)


def _kernel_bwd(scale, causal, window, block_size, residuals, do):
    q, k, v, segment_ids, o, lse = residuals
    dq, dk, dv = triton.backward(q, k, v, segment_ids, o, lse, do.astype(q.dtype), scale=scale, causal=causal,
                                 window=window, block_q=block_size, block_k=block_size)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_kernel.defvjp(_kernel_fwd, _kernel_bwd)


def _pad_features(x, size):
    return x if x.shape[-1] == size else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


def flash_attention(q, k, v, segment_ids, *, causal: bool = True, window: int | None = None,
                    scale: float | None = None, impl: str = "auto", block_size: int = 64) -> jax.Array:
    """Attention ``[B, T, H, D]`` in q's dtype (see the module docstring).

    Args:
      block_size: query and key rows per block of the kernels (a power of two >= 16); T is padded to
        a multiple with invisible (segment 0) tokens.
      impl: ``"auto" | "reference" | "pallas" | "pallas_triton"`` (``"xla"`` is the reference here).
    """
    _check(q, k, v, segment_ids, window, block_size)
    impl = _common.resolve_impl(impl, KERNELS)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    steps, head_dim = q.shape[1], q.shape[-1]
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, H, T, D]
    segment_ids = segment_ids.astype(jnp.int32)
    if impl in ("reference", "xla"):
        return jnp.swapaxes(reference.attention(q, k, v, segment_ids, scale=scale, causal=causal, window=window)[0],
                            1, 2)
    size = max(16, 1 << (head_dim - 1).bit_length())
    q, k, v = (_pad_features(x, size) for x in (q, k, v))
    q, k, v = (jnp.swapaxes(pad_time(jnp.swapaxes(x, 1, 2), block_size), 1, 2) for x in (q, k, v))
    segment_ids = pad_time(segment_ids, block_size)
    o = _kernel(q, k, v, segment_ids, scale, causal, window, block_size)
    return jnp.swapaxes(o[:, :, :steps, :head_dim], 1, 2)
