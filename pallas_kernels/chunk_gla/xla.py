"""Chunk-parallel gated linear attention in pure JAX (runs on every backend).

Within a chunk of C tokens starting from state S_0, with G_t the cumulative log decay from the
chunk's first token to token t (inclusive) and L the chunk's last token:

    o_t  = scale * ( (q_t * e^{G_t})^T S_0  +  sum_{s<=t} A_ts v_s )
    A_ts = sum_k q_tk k_sk e^{G_tk - G_sk}                       (s <= t; 0 otherwise)
    S_C  = e^{G_L} * S_0  +  sum_s (k_s * e^{G_L - G_s}) v_s^T

Every exponent is <= 0: G_t <= 0, G_L - G_s <= 0, and G_t - G_s <= 0 for s <= t, where the
difference is masked to -inf *before* exponentiating (so masked entries are exact zeros and
their gradients are zeros, never inf * 0). A per-head decay (G of width 1) makes A a masked
matmul; a per-key-channel decay needs the [C, C, K] decay tensor (memory B*T*H*C*K floats).

Chunks run in parallel for A, the outputs and the per-chunk state increments; only the state
recurrence S_{n+1} = e^{G_L} S_n + K~_n^T V_n is a ``lax.scan`` over chunks. Matmul operands are in
the input dtype with float32 accumulation; states are float32. Gradients: JAX's autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._chunks import chunk_local_cumsum, from_chunks, pad_time, to_chunks


def intra_chunk_scores(q, k, cum_decay, scale: float) -> jax.Array:
    """``scale * A`` as float32 ``[..., C, C]`` from ``q, k: [..., C, K]``, ``cum_decay: [..., C, 1 or K]``."""
    chunk_size = q.shape[-2]
    causal = jnp.arange(chunk_size)[:, None] >= jnp.arange(chunk_size)[None, :]
    difference = cum_decay[..., :, None, :] - cum_decay[..., None, :, :]  # [..., t, s, 1 or K]
    decay = jnp.exp(jnp.where(causal[..., None], difference, -jnp.inf))
    if cum_decay.shape[-1] == 1:
        scores = jnp.einsum("...tk,...sk->...ts", q, k, preferred_element_type=jnp.float32)
        return scale * scores * decay[..., 0]
    q32, k32 = q.astype(jnp.float32), k.astype(jnp.float32)
    return scale * jnp.einsum("...tk,...sk,...tsk->...ts", q32, k32, decay)


def _state_recurrence(chunk_decay, chunk_kv, initial_state):
    """States before each chunk ``[B, H, N, K, V]`` and the final state, from
    ``S_{n+1} = chunk_decay_n * S_n + chunk_kv_n``."""

    def step(state, inputs):
        decay, kv = inputs
        return decay[..., None] * state + kv, state

    inputs = (jnp.moveaxis(chunk_decay, 2, 0), jnp.moveaxis(chunk_kv, 2, 0))
    final_state, states = jax.lax.scan(step, initial_state, inputs)
    return jnp.moveaxis(states, 0, 2), final_state


def chunk_gla(q, k, v, log_decay, scale: float, initial_state, chunk_size: int):
    """``(o [B, T, H, V] float32, final_state [B, H, K, V] float32)``; ``log_decay: [B, T, H, 1 or K]``."""
    steps, dtype = q.shape[1], q.dtype
    q, k, v, log_decay = (pad_time(x, chunk_size) for x in (q, k, v, log_decay))
    cum_decay = to_chunks(chunk_local_cumsum(log_decay, chunk_size), chunk_size)  # [B, H, N, C, 1 or K]
    q, k, v = (to_chunks(x, chunk_size) for x in (q, k, v))
    last = cum_decay[..., -1:, :]
    q_decayed = (q * jnp.exp(cum_decay)).astype(dtype)
    k_to_end = (k * jnp.exp(last - cum_decay)).astype(dtype)

    scores = intra_chunk_scores(q, k, cum_decay, scale)
    o_intra = jnp.einsum("...ts,...sv->...tv", scores.astype(dtype), v, preferred_element_type=jnp.float32)
    chunk_kv = jnp.einsum("...sk,...sv->...kv", k_to_end, v, preferred_element_type=jnp.float32)
    states, final_state = _state_recurrence(jnp.exp(last[..., 0, :]), chunk_kv, initial_state.astype(jnp.float32))
    o_inter = jnp.einsum("...tk,...kv->...tv", q_decayed, states.astype(dtype), preferred_element_type=jnp.float32)
    o = from_chunks(o_intra + scale * o_inter)
    return o[:, :steps], final_state
