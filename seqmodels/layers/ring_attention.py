"""Ring attention inside ``context_map``: a shard's queries against key/value blocks passed shard to shard,
forward and backward, with memory per shard independent of the number of shards C.

Shard j holds ``L = T / C`` queries, keys and values; in round r (0 .. C - 1) it holds the block of shard
``(j - r) mod C`` and folds the sub-blocks that round's plan (``round_plan``) names into an online softmax
(flash attention's rule, float32, per query: running maximum ``m``, sum ``l``, unnormalised output ``o``):

    s = q k^T / sqrt(D) (masked by the visibility rule),   m' = max(m, max_k s),
    l' = e^{m - m'} l + sum_k e^{s_k - m'},                o' = e^{m - m'} o + sum_k e^{s_k - m'} v_k,

then ``y = o / l`` and ``lse = m + log l`` (``y = 0`` for a query that sees no key). The forward saves only
the shard's q, k, v, segment ids, positions, ``y`` and the float32 ``lse`` (a ``jax.custom_vjp``).

The backward passes the key/value blocks round the ring again, each with its float32 ``dK, dV``
accumulating as it travels, and recomputes one sub-block's probabilities at a time from the saved ``lse``
(FlashAttention-2's backward, as ring-flash-attention runs it per block):

    p = e^{s - lse},  dV += p^T dy,  dp = dy V^T,  D = rowsum(dy * y),  ds = p (dp - D),
    dq += ds K / sqrt(D),  dK += ds^T q / sqrt(D).

After round ``C - 1`` shard j holds shard ``j + 1``'s block with its gradients complete; one more shift
brings every ``dK, dV`` home. The backward ring is closed (shard 0 receives the last shard's block) so
that every block's gradients travel the whole way round, also for causal attention.

**Plans.** A plan lists, per round, the branches one ``lax.switch`` picks between by the shard index and,
per branch, the (query part, key part) sub-blocks it folds; a part is ``all`` of the shard or its
``first`` / ``second`` half. A skipped sub-block is one whose keys all lie after all its queries in the
row: by the visibility rule (positions increase with the token index within a document; other documents
are masked by segment) such a block sees nothing. Every folded sub-block is still masked by the rule.

* bidirectional: every round folds ``(all, all)`` (the ring is closed in the forward too).
* causal, ``contiguous`` (shard c holds tokens ``[c L, (c + 1) L)``): round 0 folds ``(all, all)``
  (the diagonal), round r folds ``(all, all)`` on shards ``j >= r`` and nothing on the others (a block
  from a later shard); shard j folds ``j + 1`` blocks, 4 (j + 1) half-by-half sub-blocks.
* causal, ``balanced`` (``seqmodels.layers.context.to_balanced``: shard j holds chunks j and 2C - 1 - j
  of 2C): round 0 folds ``(all, first)`` and ``(second, second)`` (3 sub-blocks, two of them diagonal);
  round r holds shard i's chunks (i, 2C - 1 - i) and folds ``(all, first)`` when ``i < j`` (``j >= r``)
  and ``(second, all)`` when ``i > j``: 2 sub-blocks; every shard folds ``2C + 1`` sub-blocks.

**Why a sub-block is an XLA einsum, not a kernel.** Folding a block needs from it its output and per-query
log-sum-exp (``y = sum_b e^{lse_b - lse} y_b``), and the backward needs its dq, dK, dV under the *row's*
``lse`` and ``D``. The Triton flash kernels (``pallas_kernels.flash_attention.triton``, GPU) return ``(o,
lse)`` and their backward takes ``(o, lse)``, which is what both need; but they mask one segment-id array
against itself (the key-segment input is fed the query's array) and causality by row index counted from 0
on both sides, over queries and keys of one length. That is only a diagonal block (round 0 of the
contiguous ring). Every other block needs a separate key segment-id input, the positions or a key row
offset for the causal test, unequal query and key lengths (``T / C`` by ``T / (2C)`` balanced) and, for
grouped-query heads, keys and values repeated per query head. Splash (TPU) takes separate query and key
segment ids and non-square static masks and returns its logsumexp (``save_residuals``), but requires
every query row to see some key (its ``SegmentIds`` note: an all-masked row gives an invalid softmax),
which ring blocks break whenever a document starts inside this shard, and its backward under an outside
``lse`` is reachable only through private functions. So every sub-block is the einsum above, its float32
scores formed one query tile at a time (``query_tile``: up to ``QUERY_TILE`` rows, by ``lax.map`` in the
forward and ``lax.scan`` summing dK, dV in the backward), and an ``optimization_barrier`` makes each round
wait for the previous round's carry, so that XLA does not compute every round's scores up front.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from seqmodels.layers.attention import visibility_mask
from seqmodels.layers.context import pass_along, shard_index

LAYOUTS = ("contiguous", "balanced")
PARTS = ("all", "first", "second")
_MASKED = -1e30  # a finite "minus infinity": exp(_MASKED - m) is 0 and never nan
# Rows of a sub-block whose scores are live at once (module docstring). The v5e-8 compile of 2 scanned
# Transformer++ layers at the 350M width, T = 65,536 over mesh.context=8 (seqmodels/layers/context_attention.py's
# docstring), per-chip peak: 21.0 GiB at 1,024 rows, 3.99 at 256, 2.33 at 128 and 2.33 at 64, against 1.80 for
# T = 8,192 unsplit (splash). XLA keeps more than one tile's scores live, more of them the larger the tile.
QUERY_TILE = 128

Branch = tuple[tuple[str, str], ...]  # the (query part, key part) sub-blocks one branch folds


def round_plan(round_: int, *, causal: bool, layout: str) -> tuple[tuple[Branch, ...], Callable]:
    """Round ``round_``'s branches and the function of the shard index (an int or a traced scalar) that picks
    one (module docstring)."""
    whole: Branch = (("all", "all"),)
    if not causal:
        return (whole,), lambda shard: 0
    if layout == "contiguous":
        if round_ == 0:
            return (whole,), lambda shard: 0
        return ((), whole), lambda shard: (shard >= round_) * 1  # a later shard's block is above the diagonal
    if round_ == 0:
        return ((("all", "first"), ("second", "second")),), lambda shard: 0
    return ((("all", "first"),), (("second", "all"),)), lambda shard: (shard < round_) * 1


def closed_forward_ring(*, causal: bool, layout: str) -> bool:
    """Whether the forward's blocks go round a closed ring (shard 0 receives the last shard's block): all but
    contiguous causal attention, which never folds a later shard's block."""
    return not causal or layout == "balanced"


def _part(x: jax.Array, part: str, axis: int) -> jax.Array:
    if part == "all":
        return x
    half = x.shape[axis] // 2
    return jax.lax.slice_in_dim(x, 0, half, axis=axis) if part == "first" else \
        jax.lax.slice_in_dim(x, half, x.shape[axis], axis=axis)


def _put(x: jax.Array, part: str, axis: int, value: jax.Array) -> jax.Array:
    """``x`` with its ``part`` along ``axis`` replaced by ``value``."""
    if part == "all":
        return value
    other = _part(x, "second" if part == "first" else "first", axis)
    return jnp.concatenate([value, other] if part == "first" else [other, value], axis=axis)


def _scores(grouped_q, keys, q_rows, k_rows, *, causal):
    """``(mask [B, 1, 1, Tq, Tk], scores [B, Hkv, G, Tq, Tk] float32)`` of one sub-block; ``q_rows`` and
    ``k_rows`` are (segment ids, positions) pairs."""
    mask = visibility_mask(*q_rows, *k_rows, window=None, num_sinks=0, causal=causal)[:, :, None]
    scale = 1.0 / jnp.sqrt(jnp.float32(grouped_q.shape[-1]))
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", grouped_q, keys, preferred_element_type=jnp.float32) * scale
    return mask, scores


def query_tile(length: int) -> int:
    """Rows per query tile of a sub-block: the largest divisor of ``length`` not above ``QUERY_TILE``, or the
    whole ``length`` where that divisor is under an eighth of it (tiles so thin would cost more than they save)."""
    tile = max(d for d in range(1, min(length, QUERY_TILE) + 1) if length % d == 0)
    return tile if tile >= QUERY_TILE // 8 or tile == length else length


def _tiles(x: jax.Array, axis: int, count: int) -> jax.Array:
    """``x`` with its ``axis`` split into ``count`` tiles, the tile index moved to the front."""
    shape = x.shape[:axis] + (count, x.shape[axis] // count) + x.shape[axis + 1:]
    return jnp.moveaxis(x.reshape(shape), axis, 0)


def _untile(x: jax.Array, axis: int) -> jax.Array:
    """The inverse of ``_tiles``."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])


def _fold(carry, grouped_q, q_rows, block, *, causal):
    """One sub-block folded into the online softmax ``(m, l, o)`` ([B, Hkv, G, Tq] twice, [B, Hkv, G, Tq, D])."""
    running_max, running_sum, out = carry
    keys, values, *k_rows = block
    mask, scores = _scores(grouped_q, keys, q_rows, k_rows, causal=causal)
    scores = jnp.where(mask, scores, _MASKED)
    new_max = jnp.maximum(running_max, jnp.max(scores, axis=-1))
    weights = jnp.where(mask, jnp.exp(scores - new_max[..., None]), 0.0)
    decay = jnp.exp(running_max - new_max)
    out = decay[..., None] * out + jnp.einsum("bhgqk,bkhd->bhgqd", weights, values.astype(jnp.float32))
    return new_max, decay * running_sum + jnp.sum(weights, axis=-1), out


def _fold_tiled(carry, grouped_q, q_rows, block, *, causal):
    """``_fold`` over query tiles of ``query_tile`` rows in turn (``lax.map``: the tiles' rows are independent),
    so one tile's ``[B, H, tile, Tk]`` scores are live at a time, not the sub-block's."""
    count = grouped_q.shape[1] // query_tile(grouped_q.shape[1])
    if count == 1:
        return _fold(carry, grouped_q, q_rows, block, causal=causal)
    tiled = (tuple(_tiles(x, 3, count) for x in carry), _tiles(grouped_q, 1, count),
             tuple(_tiles(x, 1, count) for x in q_rows))
    folded = jax.lax.map(lambda tile: _fold(*tile, block, causal=causal), tiled)
    return tuple(_untile(x, 3) for x in folded)


def _forward_branch(branch: Branch, carry, grouped_q, q_rows, block, *, causal):
    for q_part, k_part in branch:
        part_carry = tuple(_part(x, q_part, axis) for x, axis in zip(carry, (3, 3, 3)))
        folded = _fold_tiled(part_carry, _part(grouped_q, q_part, 1), tuple(_part(x, q_part, 1) for x in q_rows),
                             tuple(_part(x, k_part, 1) for x in block), causal=causal)
        carry = tuple(_put(x, q_part, 3, y) for x, y in zip(carry, folded))
    return carry


def _sub_block_grads(q, dy, q_rows, lse, delta, keys, values, k_rows, *, causal):
    """``(dq [B, Tq, Hkv, G, D], dK, dV [B, Tk, Hkv, D])`` float32 of one sub-block under the row's ``lse`` and
    ``delta`` ([B, Hkv, G, Tq]); ``q``, ``dy`` [B, Tq, Hkv, G, D] float32."""
    mask, scores = _scores(q, keys, q_rows, k_rows, causal=causal)
    probs = jnp.where(mask, jnp.exp(scores - lse[..., None]), 0.0)
    scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
    d_scores = probs * (jnp.einsum("bqhgd,bkhd->bhgqk", dy, values) - delta[..., None]) * scale
    return (jnp.einsum("bhgqk,bkhd->bqhgd", d_scores, keys), jnp.einsum("bhgqk,bqhgd->bkhd", d_scores, q),
            jnp.einsum("bhgqk,bqhgd->bkhd", probs, dy))


def _sub_block_grads_tiled(q, dy, q_rows, lse, delta, keys, values, k_rows, *, causal):
    """``_sub_block_grads`` over query tiles in turn (``lax.scan`` summing dK, dV; module docstring)."""
    count = q.shape[1] // query_tile(q.shape[1])
    if count == 1:
        return _sub_block_grads(q, dy, q_rows, lse, delta, keys, values, k_rows, causal=causal)

    def tile(kv_grads, tile_inputs):
        q, dy, q_rows, lse, delta = tile_inputs
        d_query, d_keys, d_values = _sub_block_grads(q, dy, q_rows, lse, delta, keys, values, k_rows, causal=causal)
        return (kv_grads[0] + d_keys, kv_grads[1] + d_values), d_query

    tiled = (_tiles(q, 1, count), _tiles(dy, 1, count), tuple(_tiles(x, 1, count) for x in q_rows),
             _tiles(lse, 3, count), _tiles(delta, 3, count))
    zeros = (jnp.zeros(keys.shape, jnp.float32), jnp.zeros(values.shape, jnp.float32))
    (d_keys, d_values), d_query = jax.lax.scan(tile, zeros, tiled)
    return _untile(d_query, 1), d_keys, d_values


def _backward_branch(branch: Branch, grads, grouped_q, q_rows, d_out, lse, delta, block, *, causal):
    """``(dq, dk, dv)`` float32 with the branch's sub-blocks added; ``grouped_q``, ``d_out`` [B, L, Hkv, G, D],
    ``lse``, ``delta`` [B, Hkv, G, L]."""
    d_query, d_keys, d_values = grads
    for q_part, k_part in branch:
        keys, values, *k_rows = (_part(x, k_part, 1) for x in block)
        part_grads = _sub_block_grads_tiled(
            _part(grouped_q, q_part, 1).astype(jnp.float32), _part(d_out, q_part, 1),
            tuple(_part(x, q_part, 1) for x in q_rows), _part(lse, q_part, 3), _part(delta, q_part, 3),
            keys.astype(jnp.float32), values.astype(jnp.float32), tuple(k_rows), causal=causal)
        d_query = _put(d_query, q_part, 1, _part(d_query, q_part, 1) + part_grads[0])
        d_keys = _put(d_keys, k_part, 1, _part(d_keys, k_part, 1) + part_grads[1])
        d_values = _put(d_values, k_part, 1, _part(d_values, k_part, 1) + part_grads[2])
    return d_query, d_keys, d_values


def _run_round(round_, fold_branch, carry, *, causal, layout):
    """``fold_branch(branch, carry)`` for the branch this shard takes in ``round_`` (a ``lax.switch`` where the
    plan has several: the skipped work is not done)."""
    branches, pick = round_plan(round_, causal=causal, layout=layout)
    if len(branches) == 1:
        return fold_branch(branches[0], carry)
    return jax.lax.switch(pick(shard_index()), [functools.partial(fold_branch, branch) for branch in branches], carry)


def _group(q, kv_heads):
    batch, length, heads, dim = q.shape
    return q.reshape(batch, length, kv_heads, heads // kv_heads, dim)


def _ring_forward(q, k, v, segments, positions, causal, layout, shards):
    """``(y [B, L, H, D] in q.dtype, lse [B, Hkv, G, L] float32)``."""
    grouped = _group(q, k.shape[2])
    batch, length, kv_heads, group, dim = grouped.shape
    stats = jnp.full((batch, kv_heads, group, length), _MASKED, jnp.float32)
    carry = (stats, jnp.zeros_like(stats), jnp.zeros((*stats.shape, dim), jnp.float32))
    block, q_rows = (k, v, segments, positions), (segments, positions)
    cyclic = closed_forward_ring(causal=causal, layout=layout)
    for round_ in range(shards):
        if round_:
            block = tuple(pass_along(x, shards, cyclic=cyclic) for x in block)
        # Round r's scores wait for round r - 1's carry; else XLA computes every round's scores up front
        # (they depend only on q and the received block) and keeps them all live.
        carry, block = jax.lax.optimization_barrier((carry, block))
        fold = functools.partial(_forward_branch, grouped_q=grouped, q_rows=q_rows, block=block, causal=causal)
        carry = _run_round(round_, lambda branch, carry: fold(branch, carry), carry, causal=causal, layout=layout)
    running_max, total, out = carry
    seen = total > 0
    safe_total = jnp.where(seen, total, 1.0)
    out = jnp.where(seen[..., None], out / safe_total[..., None], 0.0)
    lse = jnp.where(seen, running_max + jnp.log(safe_total), 0.0)  # unused where nothing is seen (masked)
    return out.transpose(0, 3, 1, 2, 4).reshape(q.shape).astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _ring(q, k, v, segments, positions, causal, layout, shards):
    return _ring_forward(q, k, v, segments, positions, causal, layout, shards)[0]


def _ring_fwd(q, k, v, segments, positions, causal, layout, shards):
    out, lse = _ring_forward(q, k, v, segments, positions, causal, layout, shards)
    return out, (q, k, v, segments, positions, out, lse)


def _ring_bwd(causal, layout, shards, residuals, d_out):
    q, k, v, segments, positions, out, lse = residuals
    grouped, d_out = _group(q, k.shape[2]), _group(d_out, k.shape[2]).astype(jnp.float32)
    delta = jnp.sum(d_out * _group(out, k.shape[2]).astype(jnp.float32), axis=-1).transpose(0, 2, 3, 1)
    block, q_rows = (k, v, segments, positions), (segments, positions)
    d_query = jnp.zeros(grouped.shape, jnp.float32)
    d_keys, d_values = (jnp.zeros(x.shape, jnp.float32) for x in (k, v))
    for round_ in range(shards):
        if round_:  # the block moves on with the gradients its earlier holders added
            block = tuple(pass_along(x, shards, cyclic=True) for x in block)
            d_keys, d_values = (pass_along(x, shards, cyclic=True) for x in (d_keys, d_values))
        (d_query, d_keys, d_values), block = jax.lax.optimization_barrier(((d_query, d_keys, d_values), block))
        fold = functools.partial(_backward_branch, grouped_q=grouped, q_rows=q_rows, d_out=d_out, lse=lse,
                                 delta=delta, block=block, causal=causal)
        d_query, d_keys, d_values = _run_round(round_, lambda branch, grads: fold(branch, grads),
                                               (d_query, d_keys, d_values), causal=causal, layout=layout)
    d_keys, d_values = (pass_along(x, shards, cyclic=True) for x in (d_keys, d_values))  # home: shard j's block
    return d_query.reshape(q.shape).astype(q.dtype), d_keys.astype(k.dtype), d_values.astype(v.dtype), None, None


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(q, k, v, segments, positions, *, causal: bool, layout: str, shards: int) -> jax.Array:
    """Inside ``context_map``: full attention of this shard's queries ``q [B, L, H, D]`` to every shard's keys
    and values ``[B, L, Hkv, D]`` (``segments``, ``positions`` ``[B, L]`` ints), the shards in ``layout``
    (module docstring); ``[B, L, H, D]`` in q's dtype."""
    if layout not in LAYOUTS:
        raise ValueError(f"model.attention.context_layout must be one of {LAYOUTS}, got {layout!r}")
    return _ring(q, k, v, segments, positions, causal, layout, shards)
