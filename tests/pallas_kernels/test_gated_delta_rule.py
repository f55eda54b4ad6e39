"""gated_delta_rule: every impl against the token-by-token reference, forward and backward.

Tolerances are on ``max |x - reference| / max(1, max |reference|)``:
- float32: 1e-5. All paths compute in float32 (Pallas matmuls at HIGHEST precision) and differ
  only in summation order; observed errors are <= 1e-6 up to T = 4096 (float32 eps 1.2e-7).
- bfloat16, Pallas: 3e-2. The reference sees the same bf16-rounded inputs, but the kernels also
  round matmul operands and the stored ``W``, ``U~``, ``T``, scores, states and ``V_new`` to bf16
  (relative step 2^-8 = 3.9e-3), compounding through the chunk recurrence and the UT transform;
  observed errors are <= 1e-2.
- bfloat16, XLA: 1e-2. It computes in float32 after the input rounding, so only the final
  rounding of ``o`` and of the gradients to bf16 differs: one bf16 step, 3.9e-3.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from pallas_kernels import gated_delta_rule
from pallas_kernels.gated_delta_rule.triton import gated_delta_rule_pallas

F32_TOL = 1e-5
BF16_TOL = {"xla": 1e-2, "pallas": 3e-2, "pallas_tpu": 1e-2}  # pallas_tpu: float32 sweep, as xla


def make_inputs(shape, dtype, *, decay=True, initial=True, seed=0):
    """Typical normalisation: k L2-normalised, beta in (0, 1), log decay in [-0.2, -0.01].

    NumPy draws, so that making inputs compiles nothing."""
    batch, length, heads, key_dim, value_dim = shape
    rng = np.random.default_rng(seed)
    normal = lambda *dims: rng.standard_normal(dims, dtype=np.float32)
    k = normal(batch, length, heads, key_dim)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    beta = 1.0 / (1.0 + np.exp(-normal(batch, length, heads)))
    log_decay = rng.uniform(-0.2, -0.01, (batch, length, heads)).astype(np.float32)
    inputs = dict(
        q=jnp.asarray(normal(batch, length, heads, key_dim), dtype),
        k=jnp.asarray(k, dtype),
        v=jnp.asarray(normal(batch, length, heads, value_dim), dtype),
        beta=jnp.asarray(beta, dtype),
        log_decay=jnp.asarray(log_decay, dtype) if decay else None,
        initial_state=jnp.asarray(normal(batch, heads, key_dim, value_dim)) if initial else None,
    )
    cotangents = (
        jnp.asarray(normal(batch, length, heads, value_dim)),
        jnp.asarray(normal(batch, heads, key_dim, value_dim)),
    )
    return inputs, cotangents


# Small programs run once: compiling them fast matters more than running them fast.
QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@functools.partial(
    jax.jit, static_argnames=("impl", "chunk_size", "partition_spec"), compiler_options=QUICK_COMPILE
)
def outputs_and_grads(inputs, cotangents, impl, chunk_size, partition_spec=None):
    """``(o, final_state)`` and the gradients of ``<o, do> + <S_T, dS>`` w.r.t. every input."""

    def loss(inputs):
        o, state = gated_delta_rule(
            **inputs,
            output_final_state=True,
            chunk_size=chunk_size,
            impl=impl,
            partition_spec=partition_spec,
        )
        d_o, d_state = cotangents
        return jnp.sum(o.astype(jnp.float32) * d_o) + jnp.sum(state * d_state), (o, state)

    (_, outputs), grads = jax.value_and_grad(loss, has_aux=True)(inputs)
    return outputs, grads


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    return float(np.max(np.abs(actual - expected)) / max(1.0, float(np.max(np.abs(expected)))))


def assert_matches_reference(impl, shape, dtype, chunk_size, **kwargs):
    inputs, cotangents = make_inputs(shape, dtype, **kwargs)
    (o, state), grads = outputs_and_grads(inputs, cotangents, impl, chunk_size)
    (o_ref, state_ref), grads_ref = outputs_and_grads(inputs, cotangents, "reference", chunk_size)
    tol = F32_TOL if dtype == jnp.float32 else BF16_TOL[impl]
    assert o.dtype == dtype and o.shape == o_ref.shape
    assert state.dtype == jnp.float32
    errors = {"o": relative_error(o, o_ref), "final_state": relative_error(state, state_ref)}
    for name, grad in grads.items():
        if grad is None:
            assert inputs[name] is None
            continue
        assert grad.dtype == inputs[name].dtype, name
        assert np.all(np.isfinite(np.asarray(grad, np.float32))), name
        errors["d_" + name] = relative_error(grad, grads_ref[name])
    assert max(errors.values()) <= tol, errors


# (B, T, H, K, V), chunk: ragged T over several chunks with K != V and H > 1; T = 1; one and
# several 16-row diagonal blocks per chunk (chunk 16, 32, 64).
RAGGED = ((2, 37, 2, 16, 32), 16)
SINGLE_TOKEN = ((1, 1, 3, 32, 16), 16)
CHUNK_32 = ((1, 75, 2, 32, 16), 32)
CHUNK_64 = ((1, 130, 1, 16, 32), 64)
MANY_CHUNKS = ((1, 300, 2, 16, 16), 16)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, chunk_size, decay, initial",
    [
        (*RAGGED, True, True),
        (*RAGGED, False, False),
        (*SINGLE_TOKEN, True, False),
        (*CHUNK_32, False, True),
        (*CHUNK_64, True, False),
        (*MANY_CHUNKS, True, True),
    ],
)
def test_xla_matches_reference_float32(shape, chunk_size, decay, initial):
    assert_matches_reference("xla", shape, jnp.float32, chunk_size, decay=decay, initial=initial)


@pytest.mark.parametrize("shape, chunk_size", [CHUNK_32])
def test_xla_matches_reference_bfloat16(shape, chunk_size):
    assert_matches_reference("xla", shape, jnp.bfloat16, chunk_size)


# The cases both kernel families are checked on; each adds its own below.
KERNEL_CASES = [
    (*RAGGED, jnp.float32, True, True),
    (*SINGLE_TOKEN, jnp.float32, False, False),
    (*CHUNK_64, jnp.float32, True, False),
    (*CHUNK_32, jnp.bfloat16, True, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("shape, chunk_size, dtype, decay, initial",
                         KERNEL_CASES + [(*RAGGED, jnp.bfloat16, False, True)])
def test_pallas_matches_reference(shape, chunk_size, dtype, decay, initial):
    assert_matches_reference("pallas", shape, dtype, chunk_size, decay=decay, initial=initial)


@pytest.mark.slow
@pytest.mark.parametrize("shape, chunk_size, dtype, decay, initial",
                         KERNEL_CASES + [(*MANY_CHUNKS, jnp.float32, True, True)])
def test_tpu_kernel_matches_reference_in_interpret_mode(shape, chunk_size, dtype, decay, initial):
    assert_matches_reference("pallas_tpu", shape, dtype, chunk_size, decay=decay, initial=initial)


def test_tpu_sweep_lowers_to_mosaic_without_a_tpu():
    """With an abstract TPU as the target, ``auto`` picks the Mosaic sweep (forward; the backward is
    autodiff of xla.py) and Pallas's Mosaic lowering of it runs on CPU without libtpu."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    def loss(q, k, v, beta, log_decay):
        return jnp.sum(gated_delta_rule(q, k, v, beta, log_decay, impl="auto")[0].astype(jnp.float32) ** 2)

    device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    sequence = jax.ShapeDtypeStruct((2, 256, 4, 128), jnp.bfloat16)
    gate = jax.ShapeDtypeStruct((2, 256, 4), jnp.float32)
    with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
        traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).trace(sequence, sequence, sequence, gate, gate)
        text = traced.lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 1


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_extreme_decays_over_4096_tokens_stay_finite_and_match(impl):
    """Head 0 decays to ~0 every token (log decay in [-40, -20]: exp(-40 * 64) underflows to 0),
    head 1 hardly at all (log decay in [-1e-3, -1e-5]): no overflow, no NaN, same as reference."""
    shape = (1, 4096, 2, 16, 16)
    inputs, cotangents = make_inputs(shape, jnp.float32)
    rng = np.random.default_rng(1)
    near_zero = rng.uniform(-40.0, -20.0, (1, 4096))
    near_one = rng.uniform(-1e-3, -1e-5, (1, 4096))
    inputs["log_decay"] = jnp.asarray(np.stack([near_zero, near_one], axis=-1), jnp.float32)
    (o, state), grads = outputs_and_grads(inputs, cotangents, impl, 64)
    (o_ref, state_ref), grads_ref = outputs_and_grads(inputs, cotangents, "reference", 64)
    errors = {"o": relative_error(o, o_ref), "final_state": relative_error(state, state_ref)}
    errors.update({name: relative_error(grads[name], grads_ref[name]) for name in grads})
    assert max(errors.values()) <= F32_TOL, errors


def test_auto_traces_to_the_xla_impl_on_cpu():
    inputs, _ = make_inputs((1, 20, 2, 16, 16), jnp.float32)
    program = lambda impl: str(jax.make_jaxpr(lambda x: gated_delta_rule(**x, impl=impl))(inputs))
    assert program("auto") == program("xla")
    assert program("auto") != program("pallas")


def test_final_state_is_none_unless_requested_and_scale_defaults_to_inverse_sqrt_k():
    inputs, _ = make_inputs((1, 8, 1, 16, 16), jnp.float32)
    run = jax.jit(functools.partial(gated_delta_rule, impl="reference"), static_argnames="scale")
    o, state = run(**inputs)
    assert state is None
    o_scaled, _ = run(**inputs, scale=1.0)
    np.testing.assert_allclose(np.asarray(o) * 4.0, np.asarray(o_scaled), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_sharded_over_batch_and_heads_matches_unsharded_without_all_gather(impl):
    """8 simulated devices: batch over (data, fsdp), heads over tensor; each device runs its block."""
    inputs, cotangents = make_inputs((4, 20, 2, 16, 16), jnp.float32)
    expected_outputs, expected_grads = outputs_and_grads(inputs, cotangents, impl, 16)
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    sequence = PartitionSpec(("data", "fsdp"), None, "tensor")
    state = PartitionSpec(("data", "fsdp"), "tensor")
    with jax.set_mesh(mesh):
        place = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
        inputs = {
            name: place(x, state if name == "initial_state" else sequence)
            for name, x in inputs.items()
        }
        cotangents = (place(cotangents[0], sequence), place(cotangents[1], state))
        compiled = outputs_and_grads.lower(inputs, cotangents, impl, 16, sequence).compile()
        outputs, grads = compiled(inputs, cotangents)
    assert "all-gather" not in compiled.as_text()
    assert outputs[0].sharding.spec == sequence
    for actual, expected in zip(outputs, expected_outputs):
        assert relative_error(actual, expected) <= 1e-5
    for name, grad in grads.items():
        assert relative_error(grad, expected_grads[name]) <= 1e-5, name


def test_pallas_kernels_lower_to_triton_for_an_h200():
    """Ahead-of-time lowering for CUDA on a CPU machine: every kernel of the forward and the
    backward passes the Pallas Triton lowering (block shapes, dots, loops) at the benchmark's
    head sizes, bf16, chunk 64."""
    shape = lambda *dims: jax.ShapeDtypeStruct(dims, jnp.bfloat16)
    args = (shape(1, 256, 2, 128), shape(1, 256, 2, 128), shape(1, 256, 2, 128))
    args += (shape(1, 256, 2), shape(1, 256, 2))

    def loss(q, k, v, beta, log_decay):
        o, state = gated_delta_rule_pallas(
            q, k, v, beta, log_decay, scale=0.1, chunk_size=64, interpret=False
        )
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(state)

    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), (AxisType.Auto,), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        traced = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))).trace(*args)
        text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 7
    for kernel in ["prepare", "forward_sweep", "backward_sweep", "chunk_gradients", "ut_backward"]:
        assert f'name = "gated_delta_rule_{kernel}"' in text, kernel


def _valid_arguments():
    inputs, _ = make_inputs((1, 8, 2, 16, 32), jnp.float32)
    return inputs


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=jnp.zeros((1, 8, 16))), r"q must have shape \[B, T, H, K\] = \('\?', '\?', '\?', '\?'\), got \(1, 8, 16\)"),
        (dict(k=jnp.zeros((1, 8, 2, 32))), r"k must have shape \[B, T, H, K\] = \(1, 8, 2, 16\), got \(1, 8, 2, 32\)"),
        (dict(v=jnp.zeros((1, 9, 2, 32))), r"v must have shape \[B, T, H, V\] = \(1, 8, 2, '\?'\), got \(1, 9, 2, 32\)"),
        (dict(beta=jnp.zeros((1, 8))), r"beta must have shape \[B, T, H\] = \(1, 8, 2\), got \(1, 8\)"),
        (dict(log_decay=jnp.zeros((1, 8, 3))), r"log_decay must have shape \[B, T, H\] = \(1, 8, 2\), got \(1, 8, 3\)"),
        (dict(initial_state=jnp.zeros((1, 2, 32, 16))), r"initial_state must have shape \[B, H, K, V\] = \(1, 2, 16, 32\), got \(1, 2, 32, 16\)"),
        (dict(beta=jnp.zeros((1, 8, 2), jnp.int32)), "beta must be a floating-point array, got dtype int32"),
        (dict(v=jnp.zeros((1, 8, 2, 32), jnp.bfloat16)), "q, k and v must share one dtype"),
        (dict(q=jnp.zeros((1, 0, 2, 16)), k=jnp.zeros((1, 0, 2, 16))), "q must have at least one time step"),
        (dict(chunk_size=48), "chunk_size must be a power of two >= 16, got 48"),
        (dict(chunk_size=8), "chunk_size must be a power of two >= 16, got 8"),
        (dict(impl="cuda"), "impl must be one of"),
        (dict(partition_spec=PartitionSpec("data", "seq")), "must not shard the time axis"),
        (dict(partition_spec=("data", None, "tensor")), "partition_spec must be a jax.sharding.PartitionSpec"),
        (dict(partition_spec=PartitionSpec("data", None, "tensor", None)), "at most 3 entries"),
    ],
)
def test_bad_arguments_raise_value_error_naming_argument_and_shapes(change, message):
    arguments = {**_valid_arguments(), "impl": "pallas", **change}
    with pytest.raises(ValueError, match=message):
        gated_delta_rule(**arguments)
