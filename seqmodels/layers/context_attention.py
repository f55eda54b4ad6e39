"""Softmax attention over rows split by ``mesh.context``: every shard's queries against the gathered keys,
or, for a sliding window without sinks, against a halo.

Each shard all-gathers the row's keys, values, segment ids and positions over the ``context`` axis
(``seqmodels.layers.context.gather_sequence``) and attends its own ``T / C`` queries to all ``T`` keys
under the visibility rule of ``seqmodels.layers.attention`` (same segment, key position <= query
position within the document, the window and the sinks), so documents that cross shard boundaries,
sliding windows and sinks are exact. The rule needs no global token index: within one document the
positions increase with the token index, and a key of another document is masked by its segment.

A sliding window without sinks (``num_sinks = 0``, ``window - 1 <= T / C``) needs only the previous
shard's last ``window - 1`` keys, values, segment ids and positions: one ``ppermute`` of that halo
(zeros before the row: segment 0, masked), and ``[B, H, T / C, T / C + window - 1]`` scores.

Communication per layer otherwise: an all-gather of ``[B, T, Hkv, D]`` keys and values (``2 (C - 1) / C`` of
them arrive at each shard) and of the ``[B, T]`` segment ids and positions; the backward
reduce-scatters their gradients. Memory per shard: the gathered keys and values (``O(T)``) and the
``[B, H, T / C, T]`` scores of ``jax.nn.dot_product_attention`` with an explicit mask.

Departures from the references, and why: MaxText's load-balanced layout (shard c holding chunks c and
2C - 1 - c so that causal work is equal) pays off with kernels that skip masked blocks; the masked
dense form here computes every shard's full ``[T / C, T]`` block, so its work is already equal, and
the contiguous layout is what the recurrent mixers' state passing needs. The ring (``ppermute`` of
K/V blocks, constant memory) is not built, nor the halo for a window with sinks (a document that
started in an earlier shard needs its first ``num_sinks`` tokens from wherever they are): such a
window gathers the row like full attention, which is exact but moves ``T`` keys where
``window + num_sinks`` would do.
"""

from __future__ import annotations

import jax.numpy as jnp

from seqmodels.layers.attention import attend, visibility_mask
from seqmodels.layers.context import context_map, gather_sequence, previous_tail
from seqmodels.sharding import sequence_shards

QUERIES = ("batch", "seq", "heads", None)
KEYS = ("batch", "seq", "kv_heads", None)
ROWS = ("batch", "seq")


def split_attention(q, k, v, segment_ids, positions, *, window: int | None, num_sinks: int, causal: bool,
                       implementation: str = "auto"):
    """``attend_rows`` for rows split over ``context`` (module docstring): q ``[B, T, H, D]``, k/v
    ``[B, T, Hkv, D]``, ``segment_ids`` (None: one document per row) and ``positions`` ``[B, T]`` ints,
    every one a global array whose sequence is split over ``context``."""
    if positions is None:
        raise ValueError("split_attention needs the rows' positions (global within each document); got None")
    shards = sequence_shards()

    def _with_halo(x, width):
        return x if width == 0 else jnp.concatenate([previous_tail(x, width, shards), x], axis=1)

    def local(q, k, v, segments, positions):
        if segments is None:
            segments = jnp.ones_like(positions)  # one document per row
        if window is not None and num_sinks == 0 and window - 1 <= q.shape[1]:
            keys = [_with_halo(x, window - 1) for x in (k, v, segments, positions)]
        else:
            keys = [gather_sequence(x) for x in (k, v, segments, positions)]
        mask = visibility_mask(segments, positions, keys[2], keys[3], window=window, num_sinks=num_sinks,
                               causal=causal)
        return attend(q, keys[0], keys[1], mask, implementation=implementation)

    segment_names = None if segment_ids is None else ROWS
    return context_map(local, (q, k, v, segment_ids, positions), (QUERIES, KEYS, KEYS, segment_names, ROWS), QUERIES)
