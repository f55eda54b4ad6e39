"""The Pallas Triton kernels lower for an H200 on a machine without a GPU.

Lowering with an abstract CUDA device (``jax.sharding.use_abstract_mesh``) runs the whole
Pallas -> Triton IR translation (every primitive, block shape and matmul operand check) and emits
one ``__gpu$xla.gpu.triton`` custom call per kernel. Triton's own compilation to PTX happens in
XLA on a GPU and is not exercised here.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

from pallas_kernels import chunk_gla, linear_scan
from pallas_kernels.atlas_memory import AtlasInputs, AtlasSettings, MemoryLayout, atlas_memory

H200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")


def _lowered_for_h200(fn, *args) -> str:
    mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=H200)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_linear_scan_forward_and_backward_lower_to_two_triton_kernels(dtype):
    a = jax.ShapeDtypeStruct((2, 100, 96), dtype)
    initial = jax.ShapeDtypeStruct((2, 96), jnp.float32)

    def loss(a, b, initial):
        return jnp.sum(linear_scan(a, b, initial=initial, impl="pallas").astype(jnp.float32))

    text = _lowered_for_h200(jax.grad(loss, argnums=(0, 1, 2)), a, a, initial)
    assert text.count("__gpu$xla.gpu.triton") == 2
    assert "num_warps = 1 : i32" in text


@pytest.mark.parametrize("vector_decay", [False, True])
def test_chunk_gla_forward_and_backward_lower_to_two_triton_kernels(vector_decay):
    q = jax.ShapeDtypeStruct((1, 200, 2, 128), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((1, 200, 2, 64), jnp.bfloat16)
    log_decay = jax.ShapeDtypeStruct((1, 200, 2, 128) if vector_decay else (1, 200, 2), jnp.float32)

    def loss(q, k, v, log_decay):
        o, _ = chunk_gla(q, k, v, log_decay, impl="pallas")
        return jnp.sum(o.astype(jnp.float32))

    text = _lowered_for_h200(jax.grad(loss, argnums=(0, 1, 2, 3)), q, q, v, log_decay)
    assert text.count("__gpu$xla.gpu.triton") == 2


@pytest.mark.parametrize(("features", "expansion_dim", "fused"),
                         [(45, 90, True), pytest.param(45, 200, False, marks=pytest.mark.slow)])
def test_atlas_memory_sweep_and_its_recompute_backward_lower_to_triton(features, expansion_dim, fused):
    """``impl="pallas"`` on a GPU: the fused sweep (F 45, E 90 padded to 64 and 128; chunk 16, window 8, 5 Newton-Schulz
    steps, clip) in the forward and in the backward's segment recompute, and Newton-Schulz inside the recomputed
    chunks, all as Triton kernels. A memory side padded past 128 (E 200 -> 256) runs the xla chunk forward."""
    layout = MemoryLayout(features, 32, expansion_dim)
    settings = AtlasSettings(layout, window=8, chunk_size=16, ns_steps=5, grad_clip=1.0)
    length = 128
    keys = jax.ShapeDtypeStruct((1, length, 2, features), jnp.float32)
    values = jax.ShapeDtypeStruct((1, length, 2, 32), jnp.float32)
    gate = jax.ShapeDtypeStruct((1, length, 2), jnp.float32)
    initial = tuple(jax.ShapeDtypeStruct((2, m, n), jnp.float32) for m, n in layout.shapes)

    def loss(floats, initial):
        inputs = AtlasInputs(*floats, jnp.ones((1, length), jnp.int32))
        return jnp.sum(atlas_memory(inputs, initial, settings, impl="pallas") ** 2)

    text = _lowered_for_h200(jax.grad(loss, argnums=(0, 1)), (keys, values, keys) + (gate,) * 4, initial)
    assert ("atlas_memory_chunk_sweep_triton" in text) == fused
    assert text.count("__gpu$xla.gpu.triton") >= (3 if fused else 1)
