"""Diagonal linear scan ``h_t = a_t * h_{t-1} + b_t`` along the time axis.

    h_t = a_t * h_{t-1} + b_t,   h_{-1} = initial (or 0)        reverse=False
    h_t = a_t * h_{t+1} + b_t,   h_T    = initial (or 0)        reverse=True

``b: [B, T, ..., D]`` and ``a`` of the same shape, or ``[B, T, ..., 1]``: one decay per row of the last
axis, broadcast over it where it is used (never materialised at ``b``'s size by ``reference`` and
``xla``; ``pallas`` broadcasts it before its kernel); ``initial: [B, ..., D]``; the result ``h`` has the
shape of ``b`` and the result dtype of ``(a, b)``. Arithmetic is float32 whatever the input dtype.

Gradient (reverse=False; reverse=True mirrors the indices): with ``g_t = dL/dh_t + a_{t+1} g_{t+1}``,
a linear scan run backwards in time,

    dL/db_t = g_t,   dL/da_t = g_t h_{t-1},   dL/dinitial = a_0 g_0.

Implementations (``impl``): ``reference`` (``lax.scan`` per token, differentiated by JAX),
``xla`` (``lax.associative_scan``, backward above as a second associative scan), ``pallas``
(a Triton kernel streaming time in blocks; its backward is the same streaming loop run in the
opposite direction, fused with ``da``); ``auto`` is ``pallas`` on an accelerator, ``xla`` on CPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels import _common
from pallas_kernels.linear_scan import reference, triton, xla

__all__ = ["linear_scan"]


def _check(a, b, initial, reverse, partition_spec) -> None:
    _common.check_float("a", a)
    _common.check_float("b", b)
    if a.ndim < 2:
        raise ValueError(f"a must have shape [B, T, ...] (rank >= 2), got {tuple(a.shape)}")
    per_row = b.ndim >= 3 and a.shape == b.shape[:-1] + (1,)
    if not per_row:
        _common.check_shape("b", b, a.shape, "[B, T, ...] (the shape of a; or a is [B, T, ..., 1]: a decay per row "
                            "of b's last axis)")
    if initial is not None:
        _common.check_float("initial", initial)
        _common.check_shape("initial", initial, (b.shape[0],) + b.shape[2:], "[B, ...] (b without time)")
    if not isinstance(reverse, bool):
        raise ValueError(f"reverse must be a bool, got {reverse!r}")
    _common.check_partition_spec(partition_spec, a.ndim)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _scan(a, b, initial, reverse: bool, impl: str):
    if impl == "pallas_triton":
        return triton.scan_forward(a, b, initial, reverse)
    return xla.scan_forward(a, b, initial, reverse).astype(jnp.result_type(a, b))


def _scan_fwd(a, b, initial, reverse, impl):
    h = _scan(a, b, initial, reverse, impl)
    return h, (a, h, initial, jnp.zeros((), b.dtype))


def _scan_bwd(reverse, impl, residuals, dh):
    a, h, initial, b_dtype_marker = residuals
    if impl == "pallas_triton":
        da, db, dinitial = triton.scan_backward(a, h, initial, dh, reverse, db_dtype=b_dtype_marker.dtype)
    else:
        da, db, dinitial = xla.scan_backward(a, h, initial, dh, reverse)
    return da.astype(a.dtype), db.astype(b_dtype_marker.dtype), dinitial.astype(initial.dtype)


_scan.defvjp(_scan_fwd, _scan_bwd)


def _scan_local(a, b, initial, *, reverse: bool, impl: str):
    """The op on one shard: flatten trailing axes to channels (``[B, T, C]``, or ``[B, T, C, D]`` beside a
    per-row decay ``[B, T, C, 1]``), run, restore the shape."""
    if a.shape != b.shape and impl == "pallas_triton":  # the kernel takes one decay per channel
        a = jnp.broadcast_to(a, b.shape)
    num_batch, num_steps = b.shape[:2]
    row = () if a.shape == b.shape else (b.shape[-1],)  # the broadcast axis, kept apart
    channels = (math.prod(b.shape[2:len(b.shape) - len(row)]),)
    if initial is None:
        initial_flat = jnp.zeros((num_batch, *channels, *row), jnp.float32)
    else:
        initial_flat = initial.reshape(num_batch, *channels, *row)
    a_flat = a.reshape(num_batch, num_steps, *channels, *((1,) if row else ()))
    b_flat = b.reshape(num_batch, num_steps, *channels, *row)
    if impl == "reference":
        h = reference.linear_scan(a_flat, b_flat, initial_flat, reverse).astype(jnp.result_type(a, b))
    else:
        h = _scan(a_flat, b_flat, initial_flat, reverse, impl)
    return h.reshape(b.shape)


def linear_scan(
    a: jax.Array,
    b: jax.Array,
    *,
    initial: jax.Array | None = None,
    reverse: bool = False,
    impl: str = "auto",
    partition_spec: PartitionSpec | None = None,
) -> jax.Array:
    """``h`` with ``h_t = a_t * h_{t-1} + b_t`` along axis 1 (see the module docstring).

    Args:
      a, b: ``[B, T, ..., D]`` floating arrays of one shape, or ``a`` of ``[B, T, ..., 1]`` (a decay per row
        of the last axis, broadcast over it).
      initial: ``[B, ...]`` state before the first step scanned (the last when ``reverse``); zero if None.
      reverse: scan from the end of the sequence towards its start.
      impl: ``"auto" | "reference" | "xla" | "pallas"``.
      partition_spec: how the leading axes of ``a``/``b`` are sharded, e.g.
        ``P(("data", "fsdp"), None, "tensor")``; with a mesh set by ``jax.set_mesh`` the scan runs
        shard-local. The time entry must be None.

    Returns:
      ``h``: shape of ``b``, dtype ``result_type(a, b)``.
    """
    _check(a, b, initial, reverse, partition_spec)
    impl = _common.resolve_impl(impl)
    local = functools.partial(_scan_local, reverse=reverse, impl=impl)
    if partition_spec is None:
        return local(a, b, initial)
    state_spec = None if initial is None else _common.drop_time_axis(partition_spec)
    sharded = _common.shard_local(local, (partition_spec, partition_spec, state_spec), partition_spec)
    return sharded(a, b, initial)
