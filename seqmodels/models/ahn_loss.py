"""The AHN self-distillation loss and the random-window recipe.

``chunked_kl`` is, for student / teacher final hidden states ``s_t, u_t`` and the output head ``W``::

    sum_t w_t KL(softmax(W^T u_t) || softmax(W^T s_t)) = sum_t w_t sum_v p_t,v (log p_t,v - log q_t,v)

computed over chunks of ``chunk`` positions in a rematerialised ``lax.scan``, so neither the forward
nor the backward holds more than one ``[B, chunk, vocab]`` pair of logits.

``window_choices(seq_len)``: the paper's recipe (ByteDance-Seed/AHN, ``sliding_window_type=random``,
``ahn_position=random``) scaled to any row length: windows are the powers of two strictly between
``seq_len / 8`` and ``seq_len`` (``seq_len / 2`` when none is), and a window's sink counts are 0 and the
powers of two from 4 up to ``window / 2`` (the paper lists 0, 32, 64, 128, 512, ... for rows of 2k-32k).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def chunked_kl(student, teacher, head, weights, *, chunk: int, shards: int = 1) -> jax.Array:
    """``sum_t weights_t KL(teacher_t || student_t)``; ``student, teacher [B, T, D]``, ``head [D, V]``,
    ``weights [B, T]`` float32 (0 drops a position).

    ``shards``: the number of contiguous pieces the row is split into over ``mesh.context``. Chunks then lie
    within a piece (``chunk`` at most ``T / shards``, each piece padded to whole chunks) and the scan walks
    every piece's i-th chunk at once, so each device reads only its own positions (no gather of the hidden
    states) and the pieces' sums add at the end."""
    if student.shape != teacher.shape or student.ndim != 3:
        raise ValueError(f"student and teacher hidden states must be one [B, T, D] shape, got {student.shape} "
                         f"and {teacher.shape}")
    if weights.shape != student.shape[:2]:
        raise ValueError(f"weights must be [B, T] = {list(student.shape[:2])}, got {list(weights.shape)}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    batch, length, width = student.shape
    if length % shards:
        raise ValueError(f"a row of {length} positions cannot be split into {shards} equal pieces")
    piece = length // shards
    chunk = min(chunk, piece)
    padded = -(-piece // chunk) * chunk

    def chunks(x):  # [B, T, ...] -> [T / (C chunk), B, C, chunk, ...]: the scan axis leads, the pieces stay apart
        x = x.reshape(batch, shards, piece, *x.shape[2:])
        x = jnp.pad(x, [(0, 0), (0, 0), (0, padded - piece)] + [(0, 0)] * (x.ndim - 3))
        return jnp.moveaxis(x.reshape(batch, shards, padded // chunk, chunk, *x.shape[3:]), 2, 0)

    @jax.checkpoint
    def one_chunk(total, pieces):
        s, u, w = pieces
        log_q = jax.nn.log_softmax(jnp.dot(s, head.astype(s.dtype), preferred_element_type=jnp.float32), axis=-1)
        log_p = jax.nn.log_softmax(jnp.dot(u, head.astype(u.dtype), preferred_element_type=jnp.float32), axis=-1)
        kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
        return total + jnp.sum(kl * w), None

    total, _ = jax.lax.scan(one_chunk, jnp.zeros((), jnp.float32), (chunks(student), chunks(teacher), chunks(weights)))
    return total


def window_choices(seq_len: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(windows [W], sinks [S], valid [W, S])``: the random-window table for rows of ``seq_len`` (docstring)."""
    if seq_len < 4:
        raise ValueError(f"model.ahn.random_window needs rows of at least 4 tokens, got seq_len={seq_len}")
    windows = [2 ** k for k in range(1, seq_len.bit_length() + 1) if seq_len / 8 < 2 ** k < seq_len]
    windows = windows or [seq_len // 2]
    sinks = [0] + [2 ** k for k in range(2, max(windows).bit_length()) if 2 ** k <= max(windows) // 2]
    valid = np.array([[s <= w // 2 for s in sinks] for w in windows])
    return jnp.asarray(windows, jnp.int32), jnp.asarray(sinks, jnp.int32), jnp.asarray(valid)
