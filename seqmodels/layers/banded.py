"""Sliding-window attention over packed rows in memory linear in T: the banded form (plain XLA).

The rule of ``seqmodels.layers.attention`` with a window (the ``swa`` mixer, causal):

    visible(q, k) = seg_k != 0  and  seg_k == seg_q  and  pos_k <= pos_q
                    and (pos_q - pos_k < window  or  pos_k < num_sinks)

The packer writes each document as one contiguous run of its segment id with positions restarting
at 0, so within a document row indices differ as positions do and the document of row t starts at
row ``t - pos_t``. Queries are split into blocks of ``Bq`` rows (T padded with segment-0 rows to a
multiple). Block b (rows ``[b Bq, b Bq + Bq)``) scores

- the key slice ``[b Bq - n Bq, b Bq + Bq)`` with ``n = ceil((window - 1) / Bq)``: every key of
  every query's window (``[t - window + 1, t]``), and the sinks of every document that starts in
  it (a sink a query sees comes before that query); rows before 0 are segment-0 padding;
- the ``num_sinks`` sink keys of the document of the block's first query, gathered at rows
  ``q_first - pos[q_first] + j``: the only document of the block that can start before the
  slice (documents are contiguous, so one that starts before ``q_first`` contains it). A gathered
  row is kept only if it lies before the slice (de-duplication: a sink inside the slice is
  scored there, once) and at or after row 0;

and applies the rule above to every scored key, so nothing invisible is ever counted and, for
contiguous documents, nothing visible is missed. Softmax and the weighted sum are those of
``jax.nn.dot_product_attention``'s XLA path (float32 scores scaled by ``D ** -0.5``, float32
softmax, probabilities cast to the key dtype); a query with no visible key (padding) gets 0
where that path averages all values (its output is loss-masked; no real token sees it). Autodiff
gives the backward. Grouped key/value heads are shared by their query heads without repeating.

Memory: scores ``[B, T / Bq, H, Bq, L]`` with ``L = (n + 1) Bq + num_sinks``, i.e.
``O(B H T (window + 2 Bq + num_sinks))``, and the key/value slices ``O(B T L Hkv D / Bq)``:
linear in T, never ``[T, T]``. Compute is ``L / (window + num_sinks)`` times the visible keys'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

DEFAULT_BLOCK = 128


def _check(q, k, v, segment_ids, positions, window, num_sinks, block_size) -> None:
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"banded attention needs q [B, T, H, D] and k, v [B, T, Hkv, D] of one B, T and D, got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]})")
    for name, rows in (("segment_ids", segment_ids), ("positions", positions)):
        if tuple(rows.shape) != q.shape[:2] or not jnp.issubdtype(rows.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer [B, T] = {q.shape[:2]} array, got {rows.dtype} {rows.shape}")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"banded attention needs a sliding window (a positive int, swa.window), got {window!r}; "
                         "full-context attention over packed rows goes through splash / flash "
                         "(model.attention.implementation=auto)")
    if not isinstance(num_sinks, int) or num_sinks < 0:
        raise ValueError(f"num_sinks must be an int >= 0, got {num_sinks!r}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


def _blocks(x, block: int, count: int, left: int):
    """``x [B, T, ...]`` padded with zeros (``left`` blocks before, up to ``count + left`` blocks in all)
    and split into blocks ``[B, count + left, block, ...]``."""
    pad = [(0, 0), (left * block, (count + left) * block - left * block - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad).reshape(x.shape[0], count + left, block, *x.shape[2:])


def _slices(blocks, count: int, left: int):
    """Per query block b, blocks ``b .. b + left`` of ``blocks`` (padded coordinates) as one run:
    ``[B, count, (left + 1) block, ...]``."""
    run = jnp.stack([blocks[:, offset:offset + count] for offset in range(left + 1)], axis=2)
    return run.reshape(run.shape[0], count, -1, *run.shape[4:])


def banded_attention(q, k, v, segment_ids, positions, *, window: int, num_sinks: int = 0,
                     block_size: int = DEFAULT_BLOCK) -> jax.Array:
    """Causal sliding-window attention ``[B, T, H, D]`` with per-document sinks (module docstring).

    Args:
      q: ``[B, T, H, D]``; k, v: ``[B, T, Hkv, D]`` (H a multiple of Hkv).
      segment_ids, positions: ``[B, T]`` ints; segment 0 is padding, each document one contiguous
        run of its id with positions 0, 1, 2, ...
      window: keys a query sees, itself included (>= 1); num_sinks: first tokens of each document
        every later query of it also sees.
      block_size: query rows per block (``Bq``; min(block_size, T) is used).
    """
    _check(q, k, v, segment_ids, positions, window, num_sinks, block_size)
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    block = min(block_size, length)
    count = -(-length // block)
    left = -(-(window - 1) // block)
    segment_ids, positions = segment_ids.astype(jnp.int32), positions.astype(jnp.int32)

    q_blocks = _blocks(q, block, count, 0).reshape(batch, count, block, kv_heads, heads // kv_heads, head_dim)
    q_seg, q_pos = (_blocks(x, block, count, 0) for x in (segment_ids, positions))  # [B, n, Bq]
    keys, values, k_seg, k_pos = (_slices(_blocks(x, block, count, left), count, left)
                                  for x in (k, v, segment_ids, positions))  # [B, n, L_w, ...]
    if num_sinks:
        first = jnp.arange(count) * block  # row of each block's first query
        rows = (first - positions[:, first])[..., None] + jnp.arange(num_sinks)  # [B, n, S]
        kept = (rows >= 0) & (rows < (first - left * block)[:, None])
        rows = jnp.clip(rows, 0, length - 1).reshape(batch, -1)
        gather = lambda x: jnp.take_along_axis(x, rows.reshape(rows.shape + (1,) * (x.ndim - 2)), axis=1).reshape(
            batch, count, num_sinks, *x.shape[2:])
        keys = jnp.concatenate([keys, gather(k)], axis=2)
        values = jnp.concatenate([values, gather(v)], axis=2)
        k_seg = jnp.concatenate([k_seg, jnp.where(kept, gather(segment_ids), 0)], axis=2)
        k_pos = jnp.concatenate([k_pos, gather(positions)], axis=2)

    q_seg, q_pos, k_seg, k_pos = q_seg[..., :, None], q_pos[..., :, None], k_seg[..., None, :], k_pos[..., None, :]
    visible = (k_seg != 0) & (k_seg == q_seg) & (k_pos <= q_pos) & ((q_pos - k_pos < window) | (k_pos < num_sinks))
    visible = visible[:, :, None, None]  # [B, n, 1, 1, Bq, L]
    scores = jnp.einsum("bnqhgd,bnlhd->bnhgql", q_blocks, keys, preferred_element_type=jnp.float32)
    scores = jnp.where(visible, scores * jnp.float32(head_dim ** -0.5), -jnp.inf)
    peak = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    weights = jnp.exp(scores - jnp.where(jnp.isfinite(peak), peak, 0.0))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    probs = (weights / jnp.where(total > 0, total, 1.0)).astype(k.dtype)
    out = jnp.einsum("bnhgql,bnlhd->bnqhgd", probs, values)
    return out.reshape(batch, count * block, heads, head_dim)[:, :length].astype(q.dtype)
