"""Newton–Schulz: the fused kernel (interpret mode) and the XLA path against the fp32 oracle."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from pallas_kernels import newton_schulz
from pallas_kernels.newton_schulz import coefficients as coefficient_tables
from pallas_kernels.newton_schulz import reference, tpu, triton

SHAPES = [(1, 64, 64), (8, 96, 64), (3, 64, 128), (2, 256, 256), (512, 512)]


def _normal(shape, seed=0, dtype=jnp.float32):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32).astype(dtype)


def _well_conditioned(shape, seed=0, condition=10.0):
    """U diag(s) V^T with s evenly spread over [1, condition], one per matrix."""
    rows, cols = shape[-2:]
    rank = min(rows, cols)
    keys = jax.random.split(jax.random.PRNGKey(seed), 2)
    left, _ = jnp.linalg.qr(jax.random.normal(keys[0], shape[:-2] + (rows, rank)))
    right, _ = jnp.linalg.qr(jax.random.normal(keys[1], shape[:-2] + (cols, rank)))
    values = jnp.linspace(1.0, condition, rank)
    return jnp.einsum("...ik,k,...jk->...ij", left, values, right)


def _scalar_band(schedule, norm_scale, low, high):
    """Image of [low, high] under the composed quintics, on a dense grid (the promised band)."""
    s = np.linspace(low, high, 200_001) / norm_scale
    for a, b, c in schedule:
        s = a * s + b * s**3 + c * s**5
    return s.min(), s.max()


def _relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


@pytest.mark.parametrize("shape", SHAPES)
def test_pallas_matches_reference_in_fp32_and_bf16(shape):
    x = _normal(shape)
    expected = newton_schulz(x, impl="reference")
    for impl in ("pallas", "pallas_tpu", "xla"):  # pallas_tpu: the Mosaic kernel in interpret mode
        actual = newton_schulz(x, impl=impl)
        assert actual.shape == x.shape and actual.dtype == jnp.float32
        # fp32: 15 IEEE fp32 matmuls over K <= 512, entries <= 1; measured max error 7e-7.
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)
    for impl in ("pallas", "pallas_tpu"):
        actual = newton_schulz(x.astype(jnp.bfloat16), impl=impl)
        assert actual.dtype == jnp.bfloat16
        # bf16: the input and every matmul operand are rounded to bf16 (relative 2^-9), and the quintic
        # amplifies errors on small singular values up to 3.4x per step; measured 1.5-2.6% (Frobenius).
        assert _relative_error(actual, expected) < 4e-2, impl


@pytest.mark.parametrize(("name", "shape"), [("muon", (4, 64, 64)), ("polar_express", (2, 48, 96))])
def test_singular_values_stay_in_the_band_the_coefficients_promise(name, shape):
    """Normalised singular values lie in [1/(c sqrt(r)), 1] for condition c; the output's lie in the
    image of that interval under the composed quintics (muon, c = 10: [0.68, 1.134])."""
    x = _well_conditioned(shape)
    schedule, norm_scale = coefficient_tables.resolve_coefficients(name, 5)
    singular_in = np.linalg.svd(np.asarray(x), compute_uv=False)
    normalised = singular_in / np.linalg.norm(singular_in, axis=-1, keepdims=True)
    low, high = _scalar_band(schedule, norm_scale, normalised.min(), 1.0)
    if name == "muon":
        assert 0.68 < low < 0.69 and 1.13 < high < 1.14
    # fp32 stays inside the band up to round-off; bf16 operand rounding moves singular values by
    # about 1% (measured up to 0.8% outside the band), hence a 3e-2 slack.
    runs = (("pallas", jnp.float32, 1e-4), ("xla", jnp.float32, 1e-4), ("pallas", jnp.bfloat16, 3e-2))
    for impl, dtype, slack in runs:
        out = newton_schulz(x.astype(dtype), coefficients=name, impl=impl)
        singular_out = np.linalg.svd(np.asarray(out, np.float32), compute_uv=False)
        assert singular_out.min() > low - slack and singular_out.max() < high + slack, (impl, dtype)


def test_zero_matrix_gives_zeros_and_a_zero_gradient():
    x, weights = jnp.zeros((2, 32, 48)), _normal((2, 32, 48), 5)

    def loss(m, impl):
        out = newton_schulz(m, impl=impl)
        return jnp.sum(out * weights), out

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    for impl in ("reference", "xla", "pallas", "pallas_tpu"):
        (_, out), grad = value_and_grad(x, impl)
        assert np.array_equal(out, x) and np.array_equal(grad, x), impl


@pytest.mark.parametrize(("name", "shape"), [("muon", (3, 48, 32)), ("polar_express", (2, 32, 48))])
def test_gradient_matches_autodiff_of_the_reference(name, shape):
    x, weights = _normal(shape, 1), _normal(shape, 2)
    loss = lambda m, impl: jnp.sum(jnp.sin(newton_schulz(m, coefficients=name, impl=impl)) * weights)
    grad = jax.jit(jax.grad(loss), static_argnums=1)
    expected = grad(x, "reference")
    for impl in ("pallas", "pallas_tpu", "xla"):
        actual = grad(x, impl)
        # fp32 backward through 15 matmuls; gradient entries are O(10): 1e-4 relative is ~1e3 ulp.
        assert _relative_error(actual, expected) < 1e-4, impl


def _dot_operand_dtypes(fn, *args):
    """The operand dtypes of every matmul (``dot_general``) in the jaxpr of ``fn(*args)``, nested jaxprs included."""
    found = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                visit(sub)

    visit(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_bf16_backward_runs_bf16_matmuls_near_the_fp32_gradient(impl):
    x, weights = _normal((2, 32, 48), 3, jnp.bfloat16), _normal((2, 32, 48), 4)
    loss = lambda m, impl: jnp.sum(newton_schulz(m, impl=impl).astype(jnp.float32) * weights)
    grad = jax.jit(jax.grad(loss), static_argnums=1)
    actual, expected = grad(x, impl), grad(x.astype(jnp.float32), "reference")
    assert actual.dtype == jnp.bfloat16
    # bf16 operands in the 15 forward and 20 backward matmuls, fp32 accumulation: the forward's bf16 error
    # is 1.5-2.6% (test above) and the pullback of each step reads the bf16-rounded iterates again, so about
    # twice that: measured 4.0-6.0% (Frobenius) on [2, 32, 48], [8, 96, 64], [8, 64, 32] with two seeds each.
    assert _relative_error(actual, expected) < 8e-2
    # Every matmul of the gradient takes bf16 operands: 3 a step in the forward and 4 in the backward (5 steps);
    # pallas adds its kernel's own 3 a step (the backward recomputes the iteration with the xla path).
    dots = _dot_operand_dtypes(lambda m: grad(m, impl), x)
    assert dots and all(d == ("bfloat16", "bfloat16") for d in dots), dots
    assert len(dots) == 3 * 5 + 4 * 5 + (3 * 5 if impl == "pallas" else 0)


def test_fp32_backward_is_four_matmuls_a_step_at_highest_precision():
    """The xla backward's pullback of a step is 4 matmuls (autodiff of the forward would take 6)."""
    x, weights = _normal((2, 32, 48), 3), _normal((2, 32, 48), 4)
    grad = jax.grad(lambda m: jnp.sum(newton_schulz(m, steps=3, impl="xla") * weights))
    dots = _dot_operand_dtypes(grad, x)
    assert len(dots) == 3 * 3 + 4 * 3 and all(d == ("float32", "float32") for d in dots), dots


def test_steps_zero_returns_the_normalised_input_and_schedules_resolve_as_documented():
    x = _normal((3, 16, 24))
    normalised = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + 1e-7)
    np.testing.assert_allclose(newton_schulz(x, steps=0, impl="pallas"), normalised, rtol=1e-6)
    muon = newton_schulz(x, impl="pallas")
    repeated = newton_schulz(x, coefficients=[(3.4445, -4.7750, 2.0315)], impl="pallas")
    np.testing.assert_array_equal(repeated, muon)
    schedule, norm_scale = coefficient_tables.resolve_coefficients("polar_express", 10)
    assert norm_scale == 1.01 and len(schedule) == 10
    first = (8.28721201814563 / 1.01, -23.595886519098837 / 1.01**3, 17.300387312530933 / 1.01**5)
    assert schedule[0] == pytest.approx(first)
    assert schedule[7:] == ((1.875, -1.25, 0.375),) * 3


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_batch_axes_and_dtypes_are_preserved(impl):
    """Each matrix of a batch is computed as it is alone: the same operations on the same operands, bitwise."""
    x = _normal((2, 3, 16, 40), dtype=jnp.bfloat16)
    out = newton_schulz(x, impl=impl)
    assert out.shape == x.shape and out.dtype == x.dtype
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(np.asarray(out[i, j], np.float32),
                                          np.asarray(newton_schulz(x[i, j], impl=impl), np.float32))


@pytest.mark.parametrize("tall", [False, True])
def test_kernel_padding_stays_exactly_zero(tall):
    rows, cols = (40, 24) if tall else (24, 40)
    padded = jnp.pad(_normal((2, rows, cols)), ((0, 0), (0, 64 - rows), (0, 64 - cols)))
    schedule, norm_scale = coefficient_tables.resolve_coefficients("polar_express", 6)
    out = triton.fused_call(padded, coefficients=schedule, norm_scale=norm_scale, eps=1e-7, tall=tall)
    assert np.all(np.asarray(out[:, rows:, :]) == 0) and np.all(np.asarray(out[:, :, cols:]) == 0)
    assert np.all(np.abs(np.asarray(out[:, :rows, :cols])) > 0)


def test_kernel_lowers_to_triton_ir_for_an_h200_without_a_gpu():
    """Pallas's Triton lowering (power-of-two shapes, dot operand types, reductions) runs on CPU
    against an abstract H200; compiling the Triton IR to PTX still needs a GPU."""
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    schedule, norm_scale = coefficient_tables.resolve_coefficients("muon", 5)
    for shape, dtype, tall in (((4, 128, 128), jnp.bfloat16, False), ((2, 256, 64), jnp.float32, True)):
        options = dict(coefficients=schedule, norm_scale=norm_scale, eps=1e-7, tall=tall, interpret=False)
        call = functools.partial(triton.fused_call, **options)
        with jax.sharding.use_abstract_mesh(mesh):
            traced = jax.jit(call).trace(jax.ShapeDtypeStruct(shape, dtype))
            text = traced.lower(lowering_platforms=("cuda",)).as_text()
        assert "__gpu$xla.gpu.triton" in text


def test_partition_spec_runs_shard_local_and_matches_unsharded():
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    x = _normal((8, 2, 16, 32))
    expected = newton_schulz(x, impl="pallas")
    spec = PartitionSpec(("data", "fsdp", "tensor"))
    run = jax.jit(lambda m: newton_schulz(m, impl="pallas", partition_spec=spec))
    with jax.set_mesh(mesh):
        out = run(jax.device_put(x, NamedSharding(mesh, spec)))
        from_replicated = run(jax.device_put(x, NamedSharding(mesh, PartitionSpec())))
    assert out.sharding.spec[0] == ("data", "fsdp", "tensor")
    np.testing.assert_allclose(out, expected, atol=1e-6)
    np.testing.assert_array_equal(from_replicated, out)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"x": jnp.zeros((5,))}, r"x must have shape \[\.\.\., M, N\].*got shape \(5,\)"),
        ({"x": jnp.zeros((4, 4), jnp.int32)}, "x must be a floating-point array, got dtype int32"),
        ({"x": jnp.zeros((2, 0, 4))}, r"non-empty matrices.*\(2, 0, 4\)"),
        ({"steps": -1}, "steps must be an integer >= 0, got -1"),
        ({"steps": 2.0}, "steps must be an integer >= 0"),
        ({"coefficients": "newton"}, "coefficients must be 'muon', 'polar_express'"),
        ({"coefficients": [(1.0, 2.0, 3.0)] * 3}, "coefficients must hold 1 or steps=5 .* got 3"),
        ({"coefficients": [(1.0, 2.0)]}, r"coefficients\[0\] must be a triple"),
        ({"coefficients": [(1.0, float("nan"), 0.0)]}, r"coefficients\[0\] must be a triple of finite"),
        ({"eps": -1.0}, "eps must be a finite number >= 0"),
        ({"impl": "cuda"}, "impl must be one of"),
        ({"partition_spec": PartitionSpec(None, "data")}, "leaving the matrix axes"),
        ({"partition_spec": PartitionSpec("data", None, None, None)}, "leaving the matrix axes"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(kwargs, message):
    kwargs = {"x": jnp.ones((2, 4, 4)), **kwargs}
    with pytest.raises(ValueError, match=message):
        newton_schulz(kwargs.pop("x"), **kwargs)


def test_reference_is_one_matrix_at_a_time_and_transposes_tall_inputs():
    x = _normal((40, 24))
    schedule, norm_scale = coefficient_tables.resolve_coefficients("muon", 3)
    tall = reference.newton_schulz(x, schedule, norm_scale, 1e-7)
    wide = reference.newton_schulz(x.T, schedule, norm_scale, 1e-7)
    np.testing.assert_allclose(tall, wide.T, atol=1e-6)


def test_tpu_kernel_padding_stays_exactly_zero():
    rows, cols = 24, 40
    padded = jnp.pad(_normal((2, rows, cols)), ((0, 0), (0, 128 - rows), (0, 128 - cols)))
    schedule, norm_scale = coefficient_tables.resolve_coefficients("polar_express", 6)
    out = tpu.fused_call(padded, coefficients=schedule, norm_scale=norm_scale, eps=1e-7)
    assert np.all(np.asarray(out[:, rows:, :]) == 0) and np.all(np.asarray(out[:, :, cols:]) == 0)
    assert np.all(np.abs(np.asarray(out[:, :rows, :cols])) > 0)


def test_tpu_kernel_lowers_to_mosaic_for_a_tpu_without_a_tpu():
    """Pallas's Mosaic lowering (block shapes, dot forms, reductions) runs on CPU for the TPU
    platform, without libtpu; compiling the Mosaic module is the slow ahead-of-time test's job."""
    schedule, norm_scale = coefficient_tables.resolve_coefficients("muon", 5)
    call = functools.partial(tpu.fused_call, coefficients=schedule, norm_scale=norm_scale, eps=1e-7, interpret=False)
    for shape, dtype in (((4, 128, 128), jnp.bfloat16), ((2, 256, 384), jnp.float32)):
        text = jax.jit(call).trace(jax.ShapeDtypeStruct(shape, dtype)).lower(lowering_platforms=("tpu",)).as_text()
        assert "tpu_custom_call" in text


def test_pallas_picks_the_targets_kernel_family_and_auto_skips_missing_ones():
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    from pallas_kernels import _common

    tpu_device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=tpu_device)):
        assert _common.resolve_impl("auto", ("pallas_triton", "pallas_tpu")) == "pallas_tpu"
        assert _common.resolve_impl("pallas", ("pallas_triton", "pallas_tpu")) == "pallas_tpu"
        assert _common.resolve_impl("auto", ("pallas_triton",)) == "xla"
        with pytest.raises(ValueError, match="compiles for gpu, but the target is tpu"):
            _common.resolve_impl("pallas_triton", ("pallas_triton", "pallas_tpu"))
        with pytest.raises(ValueError, match="has no pallas_tpu kernels"):
            _common.resolve_impl("pallas", ("pallas_triton",))
