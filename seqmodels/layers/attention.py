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
implementation``; ``choose_implementation``): ``splash`` (TPU kernel, segment ids, never a [T, T] matrix;
Pallas interpret mode off TPU), ``flash`` (``pallas_kernels.flash_attention``: Triton kernels with
segment ids, forward and backward, for GPU; interpret mode on CPU), ``banded`` (``banded.py``: sliding
windows with sinks in plain XLA, memory linear in T), ``cudnn`` (cuDNN's fused kernel: only for rows
without segment ids or sinks, which it has no mask for; else XLA), ``xla`` (the explicit boolean mask
above and XLA's softmax: materialises ``[B, H, T, T]`` scores) and ``auto``: on TPU ``splash`` where
it computes the rule (no sinks, T a multiple of 128), else ``banded`` for a sliding window; on GPU
``banded`` with sinks, else cuDNN for rows without segment ids and ``flash`` for packed rows;
``xla`` where none applies (full context over rows splash cannot block) and on CPU.

Sinks cannot go through splash's masks: those are static functions of (query row, key row), shared by
every row of the batch (only segment ids vary per row), while a document's sinks sit at rows ``[start,
start + num_sinks)`` with ``start`` wherever the packer put that document; the Triton flash kernels
mask by segment ids and row distance only, and have no sink blocks either. The banded form splits
queries into blocks of ``Bq`` rows; each block scores the fixed-length key slice ``[q_first - window +
1, q_last]`` (rounded out to whole blocks) plus the ``num_sinks`` keys gathered at ``q_first -
pos[q_first] + j`` (the document of the block's first query; any later document of the block starts
inside the slice, so its sinks are there), drops a gathered key that already lies in the slice, and
masks all of them by the rule: scores ``O(B H T (window + 2 Bq + num_sinks))``. It needs a window
(``implementation: banded`` on a full-context layer is an error) and causal attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._common import target_platform
from pallas_kernels.flash_attention import flash_attention
from seqmodels.layers import splash
from seqmodels.layers.banded import banded_attention

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "flash", "banded")


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
    impl = None if implementation in ("auto", "splash", "flash", "banded") else implementation
    if mask is None:
        local = None if causal_window is None else (causal_window - 1, 0)
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local,
                                            implementation=impl)
    if impl == "cudnn":
        impl = None  # cuDNN takes no arbitrary masks here; let jax choose.
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)


def choose_implementation(implementation: str, platform: str, *, length: int, packed: bool, window: int | None,
                          num_sinks: int, causal: bool) -> str:
    """The path ``attend_rows`` takes (module docstring): ``splash``, ``flash``, ``banded``, or else the
    implementation ``jax.nn.dot_product_attention`` is given (``auto``: jax's choice, ``cudnn``, ``xla``).

    ``packed``: the rows carry segment ids. An explicit ``splash`` / ``flash`` that cannot compute
    the rule (sinks) and ``banded`` without a window are errors naming the setting to use.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"model.attention.implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation in ("splash", "flash") and num_sinks:
        raise ValueError(f"{implementation} attention has no per-document sink tokens (swa.num_sinks > 0): their rows "
                         "depend on where each document starts, which static kernel masks cannot follow; use "
                         "model.attention.implementation=banded (linear memory) or auto")
    if implementation == "banded" and (window is None or not causal):
        raise ValueError("model.attention.implementation=banded is sliding-window attention (the swa mixer, causal); "
                         "this layer has full context: use auto, splash (TPU) or flash (GPU)")
    if implementation != "auto":
        return implementation
    if platform == "tpu":
        if splash.supports(length, num_sinks):
            return "splash"
        return "banded" if window is not None and causal else "auto"
    if platform == "gpu" and num_sinks:
        return "banded"
    if platform == "gpu" and packed:
        return "flash"
    return "auto"


def attend_rows(q, k, v, segment_ids, positions, *, window: int | None, num_sinks: int, causal: bool,
                implementation: str = "auto"):
    """Attention over training rows (no cache) under the visibility rule; q ``[B, T, H, D]``, k/v
    ``[B, T, Hkv, D]``, ``segment_ids`` / ``positions`` ``[B, T]`` ints or None (one document per row)."""
    batch, length = q.shape[:2]
    platform = target_platform()
    path = choose_implementation(implementation, platform, length=length, packed=segment_ids is not None,
                                 window=window, num_sinks=num_sinks, causal=causal)
    segments = jnp.ones((batch, length), jnp.int32) if segment_ids is None else segment_ids
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if path == "splash":
        return splash.splash_attention(q, k, v, segments, window=window, causal=causal,
                                       interpret=platform != "tpu")
    if path == "flash":
        repeat = q.shape[2] // k.shape[2]
        k, v = (jnp.repeat(x, repeat, axis=2) if repeat > 1 else x for x in (k, v))
        return flash_attention(q, k, v, segments, causal=causal, window=window, impl="pallas_triton")
    if path == "banded":
        return banded_attention(q, k, v, segments, positions, window=window, num_sinks=num_sinks)
    if segment_ids is None and num_sinks == 0 and causal:
        return attend(q, k, v, causal_window=window, implementation=path)
    mask = visibility_mask(segments, positions, segments, positions, causal=causal, window=window,
                           num_sinks=num_sinks)
    return attend(q, k, v, mask, implementation=path)


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
