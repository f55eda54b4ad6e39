"""Helpers shared by every op: impl dispatch, argument checks, shard-local execution.

Every public op validates its arguments here *before* anything is traced into a kernel, so a
wrong shape surfaces as a ``ValueError`` that names the argument, never as an XLA trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

IMPLS = ("auto", "reference", "xla", "pallas")


def _target_is_cpu() -> bool:
    """Whether code is being built for a CPU: the abstract device of the current abstract mesh when
    one is set (ahead-of-time lowering for a GPU from a CPU machine, ``jax.sharding.use_abstract_mesh``),
    else the default backend."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    if device is not None:
        return device.platform == "cpu"
    return jax.default_backend() == "cpu"


def resolve_impl(impl: str) -> str:
    """Map ``impl`` to a concrete implementation: ``auto`` is ``pallas`` on GPU/TPU, ``xla`` on CPU."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "xla" if _target_is_cpu() else "pallas"
    return impl


def interpret_mode() -> bool:
    """Pallas kernels run in interpret mode where there is no GPU/TPU to compile them for."""
    return _target_is_cpu()


def check_float(name: str, x) -> None:
    """Raise unless ``x`` is an array of a floating dtype."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {dtype}")


def check_shape(name: str, x, expected: Sequence[int | None], layout: str) -> None:
    """Raise unless ``x.shape`` matches ``expected`` (``None`` matches any size).

    ``layout`` is the human form of the expected shape, e.g. ``"[B, T, H, K]"``.
    """
    shape = tuple(getattr(x, "shape", ()))
    ok = len(shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, shape))
    if not ok:
        want = tuple("?" if e is None else e for e in expected)
        raise ValueError(f"{name} must have shape {layout} = {want}, got {shape}")


def check_qkv(q, k, v, **others) -> tuple[int, int, int, int]:
    """Raise unless ``q, k, v`` (and ``others``) are floating, ``q [B, T, H, K]``, ``k`` of q's shape and
    ``v [B, T, H, V]``; returns ``q.shape``."""
    for name, x in (("q", q), ("k", k), ("v", v), *others.items()):
        check_float(name, x)
    if q.ndim != 4:
        raise ValueError(f"q must have shape [B, T, H, K] (rank 4), got {tuple(q.shape)}")
    batch, steps, heads, key_dim = q.shape
    check_shape("k", k, q.shape, "[B, T, H, K]")
    check_shape("v", v, (batch, steps, heads, None), "[B, T, H, V]")
    return batch, steps, heads, key_dim


def check_chunk_size(chunk_size) -> None:
    """Chunk sizes are powers of two >= 16 (Triton block shapes and matmul operand minimums)."""
    if not isinstance(chunk_size, int) or chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {chunk_size!r}")


def shard_local(
    fn: Callable,
    in_specs: Sequence[PartitionSpec | None],
    out_specs,
) -> Callable:
    """Run ``fn`` per shard under the mesh set by ``jax.set_mesh``, or directly when there is none.

    XLA cannot partition a Pallas call, so inside a sharded ``jax.jit`` an op must run on the
    local block of each device. ``in_specs`` gives, per positional argument, the PartitionSpec of
    that argument (``None`` for an argument that is ``None``); ``out_specs`` is a pytree of specs
    matching ``fn``'s output. The op must be shard-local along the sharded axes (batch, heads):
    callers check that the time axis is not sharded.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return fn
    in_specs = tuple(PartitionSpec() if s is None else s for s in in_specs)
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def check_partition_spec(partition_spec, num_dims: int) -> None:
    """Raise unless ``partition_spec`` is None or a PartitionSpec over at most ``num_dims`` leading
    axes of a ``[B, T, ...]`` input whose time entry (axis 1) is None (ops scan along time)."""
    if partition_spec is None:
        return
    if not isinstance(partition_spec, PartitionSpec):
        raise ValueError(f"partition_spec must be a jax.sharding.PartitionSpec, got {partition_spec!r}")
    if len(partition_spec) > num_dims:
        raise ValueError(
            f"partition_spec {partition_spec} has {len(partition_spec)} entries; the inputs have "
            f"{num_dims} axes"
        )
    if len(partition_spec) > 1 and partition_spec[1] is not None:
        raise ValueError(
            f"partition_spec must not shard the time axis (entry 1), got {partition_spec[1]!r} "
            f"in {partition_spec}"
        )


def drop_time_axis(partition_spec: PartitionSpec) -> PartitionSpec:
    """The spec of a per-sequence state ``[B, ...]`` from the spec of a ``[B, T, ...]`` input."""
    entries = tuple(partition_spec)
    return PartitionSpec(*(entries[:1] + entries[2:]))
