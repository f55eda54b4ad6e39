"""Softmax attention over rows split by ``mesh.context``: every shard's queries against the gathered keys,
against key blocks passed round a ring, or, for a sliding window, against a halo.

**The rule.** Every form computes the visibility rule of ``seqmodels.layers.attention`` (``seg_k != 0``,
same segment, key position <= query position within the document when causal, the window and the
sinks), so documents that cross shard boundaries are exact. The rule needs no global token index: within
one document the positions increase with the token index, and a key of another document is masked by its
segment (segment ids are distinct per document within a row, as the packer writes them). A query that sees
no key (padding, segment 0) gets zeros in the ring and the halo forms.

Below, per layer and per shard: B rows, T tokens (``T / C`` per shard), C shards, Hkv key/value heads of
width D, H query heads, ``b`` bytes per key/value element, 4 per segment id or position.

**Gather** (``model.attention.context_impl = gather``, full context): each shard all-gathers the row's keys,
values, segment ids and positions over the ``context`` axis (``gather_sequence``) and attends its own
``T / C`` queries to all ``T`` keys (``attend`` with an explicit mask). Communication: 4 all-gathers,
``(C - 1) / C (2 B T Hkv D b + 2 B T 4)`` bytes arriving; the backward reduce-scatters the key and value
gradients (2 collectives, ``(C - 1) / C 2 B T Hkv D`` elements). Memory: the gathered ``[B, T, Hkv, D]``
keys and values and the ``[B, H, T / C, T]`` scores, both kept for the backward. ``context_layout`` does
not apply: the dense masked einsum computes every score of the ``[T / C, T]`` block in either layout,
so the balanced layout buys it nothing (it pays with a kernel that skips masked blocks, and the gather
runs none: see the ring's kernel note), and the gather keeps the contiguous layout.

**Ring** (``context_impl = ring``, full context; ``seqmodels.layers.ring_attention``): shard j starts from
its own block of keys, values, segment ids and positions and in each of ``C - 1`` rounds passes the block it
holds to shard j + 1 (``ppermute``), folding the sub-blocks the round's plan names into a float32 online
softmax; a ``lax.switch`` on the shard index skips a sub-block entirely above the causal diagonal. Its
``jax.custom_vjp`` saves only the shard's q, k, v, segment ids, positions, output and float32 log-sum-exp,
and its backward passes the blocks round the ring again with their float32 ``dK, dV`` accumulating, one
sub-block's probabilities recomputed at a time, and one last shift brings ``dK, dV`` home.
Communication: forward ``C - 1`` rounds of 4 ``ppermute`` of ``[B, T / C, ...]``, ``(C - 1) / C (2 B T Hkv
D b + 2 B T 4)`` bytes arriving (the gather's bytes in ``4 (C - 1)`` messages); backward the same again
plus ``dK, dV`` in ``2 C`` messages, ``2 B T Hkv D 4`` bytes. Memory: the residuals above (``[B, T / C,
...]``, and ``[B, H, T / C]`` float32 for the log-sum-exp), one held and one arriving block, float32
accumulators of the shard's size and the float32 scores of one query tile of a sub-block (``[B, H, tile,
T / C]``, ``tile`` up to ``ring_attention.QUERY_TILE`` = 128 rows): nothing grows with C at a fixed
``T / C``. Measured ahead of time (v5e-8, d_model 1024, 16 heads, 2 scanned layers, T = 65,536 over
``mesh.context=8``, ``context_impl=ring``, remat full, bf16): 66 GiB of temporaries with whole sub-blocks and
unrolled rounds (XLA computed every round's scores up front), 58 GiB with the rounds ordered, 20.9 GiB with
query tiles of 1,024 rows (XLA keeps several tiles' ``[16, 1024, 8192]`` float32 scores live at once), and
3.9 GiB (peak 4.0) with tiles of 256, which fits one chip's 16 GiB (the last two in one run, 2026-12-05),
and 2.24 GiB (peak 2.33, against 1.80 for T = 8,192 unsplit with splash) with tiles of 128 or 64.

**Layout** (``model.attention.context_layout``, the causal ring): ``contiguous`` folds ``j + 1`` whole
blocks on shard j, so the last shard does C blocks while shard 0 does one (each round waits for its
slowest shard). ``balanced`` (the default) moves q, k, v, segment ids and positions inside the attention
call into MaxText's load-balanced order (``seqmodels.layers.context.to_balanced``: of the row's 2C chunks,
shard c holds c and ``2C - 1 - c``), runs the ring with the causal skip at half-block granularity (round 0:
3 half-by-half sub-blocks, every later round 2 on every shard: ``2C + 1`` per shard, where the contiguous
layout's last shard does ``4C``) and moves the output back. Its cost: forward 2 ``ppermute`` for each of
the 5 inputs and for the output (12 messages, at most ``B T / C ((2 H + 2 Hkv) D b + 2 4)`` bytes
arriving), backward the transposes for the output's and q, k, v's gradients (8 messages, ``B T / C (2 H +
2 Hkv) D`` elements). It needs an even ``T / C``. Bidirectional attention does equal work in either
layout and ignores the setting.

**Halo** (a sliding window, ``window - 1 <= T / C``, under either setting): the previous shard's last
``window - 1`` keys, values, segment ids and positions arrive by one ``ppermute`` (zeros before the row:
segment 0, masked). With sinks (``num_sinks > 0``) a query may also see the first ``num_sinks`` tokens
of a document that started in an earlier shard, however far back: each shard offers the sink tokens
it holds of the document open at its last token (``num_sinks`` slots, segment 0 where the shard does
not hold that position), the ``C`` offers are all-gathered (``C num_sinks`` tokens) and shard j keeps
those of shards ``< j``. Among them a query sees the ones of its own document that lie beyond its
window (those inside it are already in the halo or the shard, and are not counted twice). Communication:
4 ``ppermute`` of ``[B, window - 1, ...]`` and, with sinks, 4 all-gathers of ``[B, C num_sinks, ...]``.
Scores ``[B, H, T / C, C num_sinks + window - 1 + T / C]``. A window wider than a shard gathers the row,
and so does a window or sink count that is traced rather than a Python int (AHN's per-step random window:
the halo's width must be static).

**Departures from the references, and why.** MaxText permutes the batch into the load-balanced order once,
before the model; here the order changes inside each attention call and back, because the recurrent
mixers' state passing and halos need the contiguous layout (the price: the re-layout's messages above,
per layer). ring-flash-attention's zigzag ring folds the same sub-blocks per round and passes float32
``dK, dV`` as here; it runs only causal attention and masks causality by row index within each flash
call, where this ring masks every sub-block by the rule (segment ids and positions: packed documents) and
also runs bidirectional attention on a closed ring. The causal contiguous forward leaves the ring open
(shard 0 never folds the last shard's block), but its backward closes it so that every block's gradients
come home. The blocks inside a shard are XLA einsums, not the flash / splash kernels: the kernels mask
row indices of one aligned block against themselves (``seqmodels.layers.ring_attention`` says what they
would need to return and take). A query that sees no key gets zeros, where ``jax.nn.dot_product_attention``
(the gather's one-device form) averages all values; such tokens carry no loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from seqmodels.layers.attention import attend, visibility_mask
from seqmodels.layers.context import (context_map, from_balanced, gather_sequence, previous_tail, shard_index,
                                      to_balanced)
from seqmodels.layers.ring_attention import LAYOUTS, ring_attention
from seqmodels.sharding import sequence_shards

QUERIES = ("batch", "seq", "heads", None)
KEYS = ("batch", "seq", "kv_heads", None)
ROWS = ("batch", "seq")
CONTEXT_IMPLS = ("gather", "ring")


def split_attention(q, k, v, segment_ids, positions, *, window: int | None, num_sinks: int, causal: bool,
                    implementation: str = "auto", context_impl: str = "gather", context_layout: str = "balanced"):
    """``attend_rows`` for rows split over ``context`` (module docstring): q ``[B, T, H, D]``, k/v
    ``[B, T, Hkv, D]``, ``segment_ids`` (None: one document per row) and ``positions`` ``[B, T]`` ints,
    every one a global array whose sequence is split over ``context``; ``context_impl`` (``gather`` or
    ``ring``) chooses the full-context form, ``context_layout`` (``balanced`` or ``contiguous``) the order
    of the ring's causal blocks."""
    if positions is None:
        raise ValueError("split_attention needs the rows' positions (global within each document); got None")
    if context_impl not in CONTEXT_IMPLS:
        raise ValueError(f"model.attention.context_impl must be one of {CONTEXT_IMPLS}, got {context_impl!r}")
    if context_layout not in LAYOUTS:
        raise ValueError(f"model.attention.context_layout must be one of {LAYOUTS}, got {context_layout!r}")
    shards = sequence_shards()
    static = isinstance(window, int) and isinstance(num_sinks, int)  # else traced (AHN's random window): gather

    def local(q, k, v, segments, positions):
        if segments is None:
            segments = jnp.ones_like(positions)  # one document per row
        if window is not None and static and window - 1 <= q.shape[1]:
            return _windowed(q, k, v, segments, positions, window=window, num_sinks=num_sinks, causal=causal,
                             shards=shards, implementation=implementation)
        if window is None and context_impl == "ring":
            return _ring(q, k, v, segments, positions, causal=causal, layout=context_layout, shards=shards)
        keys = [gather_sequence(x) for x in (k, v, segments, positions)]
        mask = visibility_mask(segments, positions, keys[2], keys[3], window=window, num_sinks=num_sinks,
                               causal=causal)
        return attend(q, keys[0], keys[1], mask, implementation=implementation)

    segment_names = None if segment_ids is None else ROWS
    return context_map(local, (q, k, v, segment_ids, positions), (QUERIES, KEYS, KEYS, segment_names, ROWS), QUERIES)


def _windowed(q, k, v, segments, positions, *, window, num_sinks, causal, shards, implementation):
    """Inside ``context_map``: a sliding window over this shard, the previous shard's last ``window - 1``
    tokens and (with sinks) the earlier shards' sink tokens (module docstring). A sink in the halo is
    seen through the halo when it lies in the query's window and through the earlier shards' offers
    otherwise, so no key is counted twice."""
    parts = [(k, v, segments, positions)]
    masks = [visibility_mask(segments, positions, segments, positions, window=window, num_sinks=num_sinks,
                             causal=causal)]
    if window > 1:
        halo = tuple(previous_tail(x, window - 1, shards) for x in (k, v, segments, positions))
        parts.insert(0, halo)
        masks.insert(0, visibility_mask(segments, positions, halo[2], halo[3], window=window, num_sinks=0,
                                        causal=causal))
    if num_sinks:
        sinks = _earlier_sinks(k, v, segments, positions, num_sinks, shards)
        parts.insert(0, sinks)
        masks.insert(0, _beyond_window_sinks(segments, positions, sinks[2], sinks[3], window, num_sinks))
    keys, values = (jnp.concatenate([part[i] for part in parts], axis=1) for i in (0, 1))
    return attend(q, keys, values, jnp.concatenate(masks, axis=-1), implementation=implementation)


def _earlier_sinks(k, v, segments, positions, num_sinks, shards):
    """Inside ``context_map``: keys, values, segment ids and positions of the sink tokens that earlier shards
    hold of the documents open at their last tokens, ``[B, C num_sinks, ...]`` (segment 0 elsewhere)."""
    slots = jnp.arange(num_sinks, dtype=positions.dtype)
    open_document = segments[:, -1:]
    held = (positions[:, None, :] == slots[None, :, None]) & (segments == open_document)[:, None, :]  # [B, S, T]
    index = jnp.argmax(held, axis=-1)
    offer_segments = jnp.where(jnp.any(held, axis=-1), open_document, 0)
    offer_k, offer_v = (jnp.take_along_axis(x, index[:, :, None, None], axis=1) for x in (k, v))
    offer_positions = jnp.broadcast_to(slots, offer_segments.shape)
    gathered = [gather_sequence(x) for x in (offer_k, offer_v, offer_segments, offer_positions)]
    earlier = jnp.repeat(jnp.arange(shards), num_sinks) < shard_index()  # [C S]: offered by shards < this one
    gathered[2] = jnp.where(earlier[None], gathered[2], 0)
    return gathered


def _beyond_window_sinks(q_segments, q_positions, k_segments, k_positions, window, num_sinks):
    """``[B, 1, Tq, S]`` mask of the earlier shards' sinks: same document, outside the query's window."""
    same = (k_segments[:, None, :] != 0) & (k_segments[:, None, :] == q_segments[:, :, None])
    distance = q_positions[:, :, None] - k_positions[:, None, :]
    return (same & (distance >= window) & (k_positions[:, None, :] < num_sinks))[:, None]


def _ring(q, k, v, segments, positions, *, causal, layout, shards):
    """Inside ``context_map``: the ring (``ring_attention``), in the load-balanced layout when it is asked for
    and the attention is causal (bidirectional work is equal on every shard in either layout): q, k, v, the
    segment ids and positions move into it and the output moves back."""
    if not (causal and layout == "balanced"):
        return ring_attention(q, k, v, segments, positions, causal=causal, layout="contiguous", shards=shards)
    moved = (to_balanced(x, shards) for x in (q, k, v, segments, positions))
    return from_balanced(ring_attention(*moved, causal=True, layout="balanced", shards=shards), shards)
