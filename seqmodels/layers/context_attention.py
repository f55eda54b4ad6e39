"""Softmax attention over rows split by ``mesh.context``: every shard's queries against the gathered keys,
against key blocks passed round a ring, or, for a sliding window, against a halo.

Every form computes the visibility rule of ``seqmodels.layers.attention`` (same segment, key position <=
query position within the document, the window and the sinks), so documents that cross shard boundaries
are exact. The rule needs no global token index: within one document the positions increase with the
token index, and a key of another document is masked by its segment (segment ids are distinct per
document within a row, as the packer writes them).

**Gather** (``model.attention.context_impl = gather``, full context): each shard all-gathers the row's keys,
values, segment ids and positions over the ``context`` axis (``gather_sequence``) and attends its own
``T / C`` queries to all ``T`` keys. Communication per layer: an all-gather of ``[B, T, Hkv, D]`` keys and
values (``2 (C - 1) / C`` of them arrive at each shard) and of the ``[B, T]`` segment ids and positions; the
backward reduce-scatters their gradients. Memory per shard: the gathered keys and values and the
``[B, H, T / C, T]`` scores of ``jax.nn.dot_product_attention`` with an explicit mask.

**Ring** (``context_impl = ring``, full context): shard j starts from its own block of keys, values,
segment ids and positions and, in each of ``C - 1`` rounds, passes the block it holds to shard j + 1
(``ppermute``) and receives shard j - r's block. It folds every block into an online softmax (flash
attention's rule: a running row maximum ``m``, sum ``l`` and unnormalised output ``o``, float32;
``m' = max(m, max_k s)``, ``l' = e^{m - m'} l + sum_k e^{s_k - m'}``, ``o' = e^{m - m'} o + sum_k e^{s_k - m'} v_k``,
``y = o / l``). Causal: a block from a later shard is entirely above the diagonal, so shard j folds
blocks only in rounds ``r <= j`` (a ``lax.cond`` skips the others' work; the ring is not closed, shard 0
receives a masked block of zeros). Bidirectional (``causal = false``) closes the ring and folds all
blocks. Communication per layer: ``C - 1`` shifts of ``[B, T / C, Hkv, D]`` keys and values plus their
segment ids and positions (the same bytes as the gather, in ``C - 1`` messages); scores
``[B, H, T / C, T / C]`` per round. Gradients are autodiff of the unrolled rounds, each round
rematerialised (``jax.checkpoint``): the backward keeps each round's received block and running
``(m, l, o)`` and recomputes one block's scores at a time.

**Halo** (a sliding window, ``window - 1 <= T / C``, under either setting): the previous shard's last
``window - 1`` keys, values, segment ids and positions arrive by one ``ppermute`` (zeros before the row:
segment 0, masked). With sinks (``num_sinks > 0``) a query may also see the first ``num_sinks`` tokens
of a document that started in an earlier shard, however far back: each shard offers the sink tokens
it holds of the document open at its last token (``num_sinks`` slots, segment 0 where the shard does
not hold that position), the ``C`` offers are all-gathered (``C num_sinks`` tokens) and shard j keeps
those of shards ``< j``. Among them a query sees the ones of its own document that lie beyond its
window (those inside it are already in the halo or the shard, and are not counted twice). Scores
``[B, H, T / C, C num_sinks + window - 1 + T / C]``. A window wider than a shard gathers the row, and so
does a window or sink count that is traced rather than a Python int (AHN's per-step random window: the
halo's width must be static).

Departures from the references, and why: MaxText's load-balanced layout (shard c holding chunks c and
2C - 1 - c so that causal work is equal) pays off with kernels that skip masked blocks; the masked
dense gather computes every shard's full ``[T / C, T]`` block, so its work is already equal, and the
contiguous layout is what the recurrent mixers' state passing needs. The ring's causal skip makes
shard j's work ``j + 1`` blocks (unequal, the price of the contiguous layout). The ring's backward is
autodiff rather than a second ring of key/value gradients (MaxText / tokamax, ring-flash-attention),
so it keeps the ``C`` received blocks (``O(T)`` keys per shard, as the gather) though never more than
one block's scores. The blocks inside a shard run the plain XLA einsum, not the splash / flash kernels.
A query that sees no key (padding, segment 0) gets zeros, where ``jax.nn.dot_product_attention`` averages
all values; such tokens carry no loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from seqmodels.layers.attention import attend, visibility_mask
from seqmodels.layers.context import context_map, gather_sequence, pass_along, previous_tail, shard_index
from seqmodels.sharding import sequence_shards

QUERIES = ("batch", "seq", "heads", None)
KEYS = ("batch", "seq", "kv_heads", None)
ROWS = ("batch", "seq")
CONTEXT_IMPLS = ("gather", "ring")
_MASKED = -1e30  # a finite "minus infinity": exp(_MASKED - m) is 0 and never nan


def split_attention(q, k, v, segment_ids, positions, *, window: int | None, num_sinks: int, causal: bool,
                    implementation: str = "auto", context_impl: str = "gather"):
    """``attend_rows`` for rows split over ``context`` (module docstring): q ``[B, T, H, D]``, k/v
    ``[B, T, Hkv, D]``, ``segment_ids`` (None: one document per row) and ``positions`` ``[B, T]`` ints,
    every one a global array whose sequence is split over ``context``; ``context_impl`` (``gather`` or
    ``ring``) chooses the full-context form."""
    if positions is None:
        raise ValueError("split_attention needs the rows' positions (global within each document); got None")
    if context_impl not in CONTEXT_IMPLS:
        raise ValueError(f"model.attention.context_impl must be one of {CONTEXT_IMPLS}, got {context_impl!r}")
    shards = sequence_shards()
    static = isinstance(window, int) and isinstance(num_sinks, int)  # else traced (AHN's random window): gather

    def local(q, k, v, segments, positions):
        if segments is None:
            segments = jnp.ones_like(positions)  # one document per row
        if window is not None and static and window - 1 <= q.shape[1]:
            return _windowed(q, k, v, segments, positions, window=window, num_sinks=num_sinks, causal=causal,
                             shards=shards, implementation=implementation)
        if window is None and context_impl == "ring":
            return _ring_attention(q, k, v, segments, positions, causal=causal, shards=shards)
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


def _ring_attention(q, k, v, segments, positions, *, causal: bool, shards: int):
    """Inside ``context_map``: full attention of this shard's queries by a ring of key/value blocks (module
    docstring); q ``[B, Tq, H, D]``, k/v ``[B, Tk, Hkv, D]``."""
    batch, length, heads, dim = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(batch, length, kv_heads, heads // kv_heads, dim)
    stats = jnp.full((batch, kv_heads, heads // kv_heads, length), _MASKED, jnp.float32)
    carry = (stats, jnp.zeros_like(stats), jnp.zeros((*stats.shape, dim), jnp.float32))

    @jax.checkpoint
    def fold(carry, block):
        running_max, running_sum, out = carry
        keys, values, k_segments, k_positions = block
        mask = visibility_mask(segments, positions, k_segments, k_positions, window=None, num_sinks=0,
                               causal=causal)[:, :, None]  # [B, 1, 1, Tq, Tk]
        scores = jnp.einsum("bqhgd,bkhd->bhgqk", grouped, keys, preferred_element_type=jnp.float32) / jnp.sqrt(
            jnp.float32(dim))
        scores = jnp.where(mask, scores, _MASKED)
        new_max = jax.lax.stop_gradient(jnp.maximum(running_max, jnp.max(scores, axis=-1)))  # y does not depend on it
        weights = jnp.where(mask, jnp.exp(scores - new_max[..., None]), 0.0)
        decay = jnp.exp(running_max - new_max)
        out = decay[..., None] * out + jnp.einsum("bhgqk,bkhd->bhgqd", weights, values.astype(jnp.float32))
        return new_max, decay * running_sum + jnp.sum(weights, axis=-1), out

    block = (k, v, segments, positions)
    carry = fold(carry, block)
    index = shard_index()
    for round_ in range(1, shards):
        block = tuple(pass_along(x, shards, cyclic=not causal) for x in block)
        if causal:  # the block now held comes from shard index - round_: above the diagonal when negative
            carry = jax.lax.cond(index >= round_, fold, lambda carry, _: carry, carry, block)
        else:
            carry = fold(carry, block)
    _, total, out = carry
    out = jnp.where(total[..., None] > 0, out / jnp.where(total > 0, total, 1.0)[..., None], 0.0)
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, dim).astype(q.dtype)
