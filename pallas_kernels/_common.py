"""Helpers shared by every op: impl dispatch, argument checks, shard-local execution.

Every public op validates its arguments here *before* anything is traced into a kernel, so a
wrong shape surfaces as a ``ValueError`` that names the argument, never as an XLA trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

IMPLS = ("auto", "reference", "xla", "pallas", "pallas_triton", "pallas_tpu")
# Pallas kernel families and the platform each compiles for: Triton (GPU) and Mosaic (TPU).
KERNEL_PLATFORMS = {"pallas_triton": "gpu", "pallas_tpu": "tpu"}


def target_platform() -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: what code is being built for. The abstract device of the current
    abstract mesh when one is set (ahead-of-time lowering for a TPU topology or a GPU from a CPU
    machine, ``jax.set_mesh`` / ``jax.sharding.use_abstract_mesh``), else the default backend."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    platform = device.platform if device is not None else jax.default_backend()
    return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def _target_is_cpu() -> bool:
    return target_platform() == "cpu"


def resolve_impl(impl: str, kernels: Sequence[str] = ("pallas_triton",)) -> str:
    """Map ``impl`` to a concrete implementation: ``reference``, ``xla``, ``pallas_triton`` or ``pallas_tpu``.

    ``kernels`` lists the Pallas families the op has. ``auto`` is the target platform's family
    (Triton kernels on GPU, Mosaic kernels on TPU) when the op has it, else ``xla``; on CPU it is
    ``xla``. ``pallas`` is the target platform's family (on CPU the Triton kernels, in interpret
    mode). An explicit family runs on its own platform or, in interpret mode, on CPU; never a kernel
    compiled for another platform.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    platform = target_platform()
    native = {"gpu": "pallas_triton", "tpu": "pallas_tpu"}.get(platform)
    if impl == "auto":
        return native if native in kernels else "xla"
    if impl == "pallas":
        impl = native or "pallas_triton"
    if impl in KERNEL_PLATFORMS:
        if impl not in kernels:
            raise ValueError(f"impl={impl!r}: this op has no {impl} kernels (it has {tuple(kernels) or 'none'}); "
                             "use impl='auto' or 'xla'")
        if platform != "cpu" and KERNEL_PLATFORMS[impl] != platform:
            raise ValueError(f"impl={impl!r} compiles for {KERNEL_PLATFORMS[impl]}, but the target is {platform}; "
                             "use impl='auto' or 'pallas' (the target's own kernels)")
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
