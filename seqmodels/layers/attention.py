"""Causal softmax attention with document (segment) masking, sliding windows, sinks and a KV cache.

Which key a query may see is decided from each token's segment id and position *within its
document*, so training on packed rows and decoding from a cache use one rule:

    visible(q, k) = seg_k != 0  and  seg_k == seg_q  and  pos_k <= pos_q
                    and (window is None  or  pos_q - pos_k < window  or  pos_k < num_sinks)

(``causal=False`` drops ``pos_k <= pos_q``: every key of the query's segment, for bidirectional
encoders such as the looped model's block.)

``window`` counts the keys a query sees, itself included; the first ``num_sinks`` tokens of each
document stay visible to every later query of that document (attention sinks). Segment id 0 marks
padding and empty cache slots. Attention itself is ``jax.nn.dot_product_attention`` (cuDNN on GPU
when the mask is plain causal/local, XLA otherwise) or, on TPU, splash attention (``splash.py``).

Training rows go through ``attend_rows``, which picks by ``implementation`` (``model.attention.
implementation``): ``splash`` (TPU kernel, segment ids, never a [T, T] matrix; Pallas interpret mode
off TPU), ``flash`` (``pallas_kernels.flash_attention``: Triton kernels with segment ids, forward
and backward, for GPU; interpret mode on CPU), ``cudnn`` (cuDNN's fused kernel: only for rows
without segment ids or sinks, which it has no mask for; else XLA), ``xla`` (the explicit boolean
mask above and XLA's softmax: materialises ``[B, H, T, T]`` scores) and ``auto``: on TPU ``splash``
and on GPU cuDNN for rows without segment ids, else ``flash``, wherever they compute the rule (no
sinks; splash: T a multiple of 128), else ``xla``; on CPU ``xla``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._common import target_platform
from pallas_kernels.flash_attention import flash_attention
from seqmodels.layers import splash


def visibility_mask(q_segments, q_positions, k_segments, k_positions, *, window: int | None,
                    num_sinks: int, causal: bool = True) -> jax.Array:
    """Boolean ``[B, 1, Tq, Tk]`` mask of the rule above; inputs are ``[B, Tq]`` and ``[B, Tk]`` ints."""
    q_seg, q_pos = q_segments[:, :, None], q_positions[:, :, None]
    k_seg, k_pos = k_segments[:, None, :], k_positions[:, None, :]
    visible = (k_seg != 0) & (k_seg == q_seg)
    if causal:
        visible &= k_pos <= q_pos
    if window is not None:
        visible &= (q_pos - k_pos < window) | (k_pos < num_sinks)
    return visible[:, None]


def attend(q, k, v, mask=None, *, causal_window: int | None = None, implementation: str = "auto"):
    """``softmax(q k^T / sqrt(D) + mask) v`` with grouped-query heads; q ``[B, T, H, D]``, k/v ``[B, S, Hkv, D]``.

    ``mask=None`` means plain causal attention over aligned q/k (optionally ``causal_window``-local),
    which lets cuDNN run; otherwise ``mask`` is a boolean ``[B, 1, T, S]``.
    """
    impl = None if implementation in ("auto", "splash", "flash") else implementation
    if mask is None:
        local = None if causal_window is None else (causal_window - 1, 0)
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local,
                                            implementation=impl)
    if impl == "cudnn":
        impl = None  # cuDNN takes no arbitrary masks here; let jax choose.
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)


def attend_rows(q, k, v, segment_ids, positions, *, window: int | None, num_sinks: int, causal: bool,
                implementation: str = "auto"):
    """Attention over training rows (no cache) under the visibility rule; q ``[B, T, H, D]``, k/v
    ``[B, T, Hkv, D]``, ``segment_ids`` / ``positions`` ``[B, T]`` ints or None (one document per row)."""
    batch, length = q.shape[:2]
    platform = target_platform()
    use_splash = implementation == "splash" or (
        implementation == "auto" and platform == "tpu" and splash.supports(length, num_sinks))
    use_flash = implementation == "flash" or (
        implementation == "auto" and platform == "gpu" and segment_ids is not None and not num_sinks)
    if (use_splash or use_flash) and num_sinks:
        raise ValueError(f"{implementation} attention has no per-document sink tokens (swa.num_sinks > 0); use "
                         "model.attention.implementation=auto or xla")
    if use_splash:
        segments = jnp.ones((batch, length), jnp.int32) if segment_ids is None else segment_ids
        return splash.splash_attention(q, k, v, segments, window=window, causal=causal,
                                       interpret=platform != "tpu")
    if use_flash:
        segments = jnp.ones((batch, length), jnp.int32) if segment_ids is None else segment_ids
        repeat = q.shape[2] // k.shape[2]
        k, v = (jnp.repeat(x, repeat, axis=2) if repeat > 1 else x for x in (k, v))
        return flash_attention(q, k, v, segments, causal=causal, window=window, impl="pallas_triton")
    if segment_ids is None and num_sinks == 0 and causal:
        return attend(q, k, v, causal_window=window, implementation=implementation)
    segments = jnp.ones((batch, length), jnp.int32) if segment_ids is None else segment_ids
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    mask = visibility_mask(segments, positions, segments, positions, causal=causal, window=window,
                           num_sinks=num_sinks)
    return attend(q, k, v, mask, implementation=implementation)


def init_kv_cache(batch_size: int, capacity: int, num_kv_heads: int, head_dim: int, dtype) -> dict:
    """An empty cache: keys/values ``[B, C, Hkv, D]`` and each slot's position (-1 = empty)."""
    return {
        "k": jnp.zeros((batch_size, capacity, num_kv_heads, head_dim), dtype),
        "v": jnp.zeros((batch_size, capacity, num_kv_heads, head_dim), dtype),
        "positions": jnp.full((batch_size, capacity), -1, jnp.int32),
    }


def cache_slots(positions: jax.Array, capacity: int, *, window: int | None, num_sinks: int) -> jax.Array:
    """Slot of each new token (``positions: [T]``); tokens no later query can see get slot ``capacity`` (dropped).

    Full attention writes position p at slot p. A sliding window keeps sinks at slots
    ``[0, num_sinks)`` and the rest in a ring of ``window`` slots after them.
    """
    if window is None:
        return jnp.where(positions < capacity, positions, capacity)
    ring = num_sinks + (positions - num_sinks) % window
    slots = jnp.where(positions < num_sinks, positions, ring)
    newest = positions[-1]
    still_visible = (positions < num_sinks) | (positions > newest - window)
    return jnp.where(still_visible, slots, capacity)


def update_kv_cache(cache: dict, k_new, v_new, positions, *, window: int | None, num_sinks: int) -> dict:
    """Write new keys/values (``[B, T, Hkv, D]``, at per-document ``positions: [B, T]``) into ``cache``."""
    capacity = cache["k"].shape[1]
    slots = cache_slots(positions[0], capacity, window=window, num_sinks=num_sinks)
    return {
        "k": cache["k"].at[:, slots].set(k_new.astype(cache["k"].dtype), mode="drop"),
        "v": cache["v"].at[:, slots].set(v_new.astype(cache["v"].dtype), mode="drop"),
        "positions": cache["positions"].at[:, slots].set(positions, mode="drop"),
    }


def cache_capacity(max_len: int, window: int | None, num_sinks: int) -> int:
    """Slots a cache needs: every position for full attention, sinks + window for a sliding window."""
    return max_len if window is None else min(max_len, num_sinks + window)
