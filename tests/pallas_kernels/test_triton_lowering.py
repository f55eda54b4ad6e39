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
