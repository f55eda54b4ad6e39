"""Softmax attention over rows split by ``mesh.context``: every shard's queries against the gathered keys.

Each shard all-gathers the row's keys, values, segment ids and positions over the ``context`` axis
(``seqmodels.layers.context.gather_sequence``) and attends its own ``T / C`` queries to all ``T`` keys
under the visibility rule of ``seqmodels.layers.attention`` (same segment, key position <= query
position within the document, the window and the sinks), so documents that cross shard boundaries,
sliding windows and sinks are exact. The rule needs no global token index: within one document the
positions increase with the token index, and a key of another document is masked by its segment.

Communication per layer: an all-gather of ``[B, T, Hkv, D]`` keys and values (``2 (C - 1) / C`` of
them arrive at each shard) and of the ``[B, T]`` segment ids and positions; the backward
reduce-scatters their gradients. Memory per shard: the gathered keys and values (``O(T)``) and the
``[B, H, T / C, T]`` scores of ``jax.nn.dot_product_attention`` with an explicit mask.

Departures from the references, and why: MaxText's load-balanced layout (shard c holding chunks c and
2C - 1 - c so that causal work is equal) pays off with kernels that skip masked blocks; the masked
dense form here computes every shard's full ``[T / C, T]`` block, so its work is already equal, and
the contiguous layout is what the recurrent mixers' state passing needs. The ring (``ppermute`` of
K/V blocks, constant memory) and the sliding-window halo (only the previous ``window - 1`` tokens and
the documents' sinks cross devices) are not built: a sliding window gathers the row like full
attention, which is exact but moves ``T`` keys where ``window + num_sinks`` would do.
"""

from __future__ import annotations

import jax.numpy as jnp

from seqmodels.layers.attention import attend, visibility_mask
from seqmodels.layers.context import context_map, gather_sequence

QUERIES = ("batch", "seq", "heads", None)
KEYS = ("batch", "seq", "kv_heads", None)
ROWS = ("batch", "seq")


def gathered_attention(q, k, v, segment_ids, positions, *, window: int | None, num_sinks: int, causal: bool,
                       implementation: str = "auto"):
    """``attend_rows`` for rows split over ``context`` (module docstring): q ``[B, T, H, D]``, k/v
    ``[B, T, Hkv, D]``, ``segment_ids`` (None: one document per row) and ``positions`` ``[B, T]`` ints,
    every one a global array whose sequence is split over ``context``."""
    if positions is None:
        raise ValueError("gathered_attention needs the rows' positions (global within each document); got None")

    def local(q, k, v, segments, positions):
        if segments is None:
            segments = jnp.ones_like(positions)  # one document per row
        all_segments, all_positions = gather_sequence(segments), gather_sequence(positions)
        mask = visibility_mask(segments, positions, all_segments, all_positions, window=window,
                               num_sinks=num_sinks, causal=causal)
        return attend(q, gather_sequence(k), gather_sequence(v), mask, implementation=implementation)

    segment_names = None if segment_ids is None else ROWS
    return context_map(local, (q, k, v, segment_ids, positions), (QUERIES, KEYS, KEYS, segment_names, ROWS), QUERIES)
