"""Gated linear attention (GLA / Mamba2-SSD / simple GLA), chunked.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,      o_t = scale * S_t^T q_t,      S_{-1} = initial_state

``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, ``log_decay g <= 0``: ``[B, T, H]`` (one decay per head,
broadcast over K: Mamba2/SSD, simple GLA) or ``[B, T, H, K]`` (one per key channel: GLA);
``initial_state: [B, H, K, V]``. ``scale`` defaults to ``K ** -0.5``. Returns ``o`` in the result
dtype of ``(q, k, v)`` and, when ``output_final_state``, ``S_{T-1}`` as float32 ``[B, H, K, V]``
(else None). Accumulation is float32 whatever the input dtype.

Implementations (``impl``): ``reference`` (token-by-token ``lax.scan``), ``xla`` (chunk-parallel
pure JAX, see xla.py), ``pallas`` (the target platform's fused forward and backward kernels, wired
here with ``jax.custom_vjp``: ``pallas_triton`` on GPU, see triton.py; ``pallas_tpu`` on TPU, see
tpu.py, per-head decays only: a per-channel decay there runs ``xla``); ``auto`` is ``pallas`` on
GPU and TPU and ``xla`` on CPU. Every
impl is differentiable in q, k, v, log_decay and initial_state. Every exponent evaluated is <= 0
(differences of cumulative log decays, masked before ``exp``), so decays near 0 or 1 over long
sequences neither overflow nor produce NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels import _common
from pallas_kernels._chunks import chunk_local_cumsum, pad_time
from pallas_kernels.chunk_gla import reference, tpu, triton, xla

__all__ = ["chunk_gla"]


def _check(q, k, v, log_decay, scale, initial_state, chunk_size, partition_spec) -> None:
    batch, steps, heads, key_dim = _common.check_qkv(q, k, v, log_decay=log_decay)
    if log_decay.ndim == 3:
        _common.check_shape("log_decay", log_decay, (batch, steps, heads), "[B, T, H]")
    else:
        _common.check_shape("log_decay", log_decay, q.shape, "[B, T, H] or [B, T, H, K]")
    if initial_state is not None:
        _common.check_float("initial_state", initial_state)
        state_shape = (batch, heads, key_dim, v.shape[-1])
        _common.check_shape("initial_state", initial_state, state_shape, "[B, H, K, V]")
    if scale is not None and not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a Python number or None, got {type(scale).__name__}")
    _common.check_chunk_size(chunk_size)
    _common.check_partition_spec(partition_spec, 3)


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    pad = size - x.shape[axis]
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _feature_size(width: int, impl: str) -> int:
    """Triton blocks: powers of two, matmul operands >= 16 per side. Mosaic blocks: any whole width."""
    return max(16, 1 << (width - 1).bit_length()) if impl == "pallas_triton" else width


KERNELS = {"pallas_triton": triton, "pallas_tpu": tpu}  # Pallas families (``_common.resolve_impl``)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _pallas_padded(q, k, v, log_decay, initial_state, scale: float, chunk_size: int, impl: str):
    """Kernel path on padded inputs (T multiple of the chunk, K and V as ``_feature_size``)."""
    return _pallas_forward(q, k, v, log_decay, initial_state, scale, chunk_size, False, impl)[:2]


def _kernel_decays(log_decay, chunk_size):
    """Chunk-local cumulative log decays in the kernels' layout: [B, H, T] per head, [B, T, H, K] per channel."""
    cum_decay = chunk_local_cumsum(log_decay, chunk_size)
    return cum_decay[..., 0].transpose(0, 2, 1) if log_decay.shape[-1] == 1 else cum_decay


def _pallas_forward(q, k, v, log_decay, initial_state, scale, chunk_size, store_states, impl):
    cum_decay = _kernel_decays(log_decay, chunk_size)
    return KERNELS[impl].forward(
        q, k, v, cum_decay, initial_state, scale=scale, chunk_size=chunk_size, store_states=store_states
    )


def _pallas_padded_fwd(q, k, v, log_decay, initial_state, scale, chunk_size, impl):
    o, final_state, chunk_states = _pallas_forward(q, k, v, log_decay, initial_state, scale, chunk_size, True, impl)
    return (o, final_state), (q, k, v, log_decay, chunk_states, final_state)


def _pallas_padded_bwd(scale, chunk_size, impl, residuals, cotangents):
    q, k, v, log_decay, chunk_states, final_state = residuals
    do, dfinal = cotangents
    cum_decay = _kernel_decays(log_decay, chunk_size)
    dq, dk, dv, dinitial = KERNELS[impl].backward(
        q, k, v, cum_decay, do.astype(v.dtype), chunk_states, dfinal, scale=scale, chunk_size=chunk_size
    )
    # dL/dg_j = sum_{t >= j} (q_t dq_t - k_t dk_t) + sum_v dS_final * S_final (see triton.py).
    per_token = q.astype(jnp.float32) * dq - k.astype(jnp.float32) * dk
    dlog_decay = jax.lax.cumsum(per_token, axis=1, reverse=True)
    dlog_decay = dlog_decay + jnp.sum(dfinal * final_state, axis=-1)[:, None]
    if log_decay.shape[-1] == 1:
        dlog_decay = jnp.sum(dlog_decay, axis=-1, keepdims=True)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv, dlog_decay, dinitial


_pallas_padded.defvjp(_pallas_padded_fwd, _pallas_padded_bwd)


def _pallas(q, k, v, log_decay, scale, initial_state, chunk_size, impl):
    """Pad (differentiably) to the kernels' shapes, run, slice back."""
    steps, key_dim, value_dim = q.shape[1], q.shape[-1], v.shape[-1]
    key_size, value_size = _feature_size(key_dim, impl), _feature_size(value_dim, impl)
    q, k, v, log_decay = (pad_time(x, chunk_size) for x in (q, k, v, log_decay))
    q, k = _pad_axis(q, 3, key_size), _pad_axis(k, 3, key_size)
    v = _pad_axis(v, 3, value_size)
    if log_decay.shape[-1] != 1:
        log_decay = _pad_axis(log_decay, 3, key_size)
    initial_state = _pad_axis(_pad_axis(initial_state, 2, key_size), 3, value_size)
    o, final_state = _pallas_padded(q, k, v, log_decay, initial_state, scale, chunk_size, impl)
    return o[:, :steps, :, :value_dim], final_state[:, :, :key_dim, :value_dim]


def _chunk_gla_local(q, k, v, log_decay, initial_state, *, scale, chunk_size, impl):
    """The op on one shard: normalise dtypes and the decay's shape, dispatch."""
    dtype = jnp.result_type(q, k, v)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    log_decay = log_decay.astype(jnp.float32)
    if log_decay.ndim == 3:
        log_decay = log_decay[..., None]
    batch, _, heads, key_dim = q.shape
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, key_dim, v.shape[-1]), jnp.float32)
    initial_state = initial_state.astype(jnp.float32)
    if impl == "reference":
        o, final_state = reference.chunk_gla(q, k, v, log_decay, scale, initial_state)
    elif impl == "xla" or (impl == "pallas_tpu" and log_decay.shape[-1] != 1):  # tpu.py: per-head decay only
        o, final_state = xla.chunk_gla(q, k, v, log_decay, scale, initial_state, chunk_size)
    else:
        o, final_state = _pallas(q, k, v, log_decay, scale, initial_state, chunk_size, impl)
    return o.astype(dtype), final_state


def chunk_gla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    log_decay: jax.Array,
    *,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    impl: str = "auto",
    partition_spec: PartitionSpec | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """``(o, final_state or None)`` of gated linear attention (see the module docstring).

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; floating.
      log_decay: ``[B, T, H]`` or ``[B, T, H, K]``, log-space decays (<= 0).
      scale: multiplies the output; ``K ** -0.5`` when None.
      initial_state: ``[B, H, K, V]`` state before the first token; zeros when None.
      output_final_state: also return the state after the last token (float32 ``[B, H, K, V]``).
      chunk_size: tokens per chunk (power of two >= 16); T need not be a multiple.
      impl: ``"auto" | "reference" | "xla" | "pallas" | "pallas_triton" | "pallas_tpu"``.
      partition_spec: sharding of the leading ``[B, T, H]`` axes, e.g.
        ``P(("data", "fsdp"), None, "tensor")``; with a mesh set by ``jax.set_mesh`` the op runs
        shard-local. The time entry must be None.
    """
    _check(q, k, v, log_decay, scale, initial_state, chunk_size, partition_spec)
    impl = _common.resolve_impl(impl, KERNELS)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    local = functools.partial(_chunk_gla_local, scale=scale, chunk_size=chunk_size, impl=impl)
    if partition_spec is None:
        o, final_state = local(q, k, v, log_decay, initial_state)
    else:
        state_spec = _common.drop_time_axis(partition_spec)
        in_specs = (partition_spec,) * 4 + (None if initial_state is None else state_spec,)
        sharded = _common.shard_local(local, in_specs, (partition_spec, state_spec))
        o, final_state = sharded(q, k, v, log_decay, initial_state)
    return o, (final_state if output_final_state else None)
