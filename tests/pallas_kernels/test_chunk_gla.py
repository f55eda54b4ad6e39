"""chunk_gla: every impl against the token-by-token oracle, outputs, final state and all gradients.

Tolerances (absolute, relative to the largest magnitude of the compared array): float32 impls
differ from the oracle only in summation order, 1e-5. With bfloat16 inputs the chunked impls
round the masked scores, the decayed q and k and the chunk states to bfloat16 before their
matmuls (float32 accumulation) and the output once more, a few bfloat16 steps (2^-8) in all: 3e-2.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels import chunk_gla

TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 3e-2}


def _inputs(batch, steps, heads, key_dim, value_dim, vector_decay, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 7)
    q = jax.random.normal(keys[0], (batch, steps, heads, key_dim)).astype(dtype)
    k = jax.random.normal(keys[1], (batch, steps, heads, key_dim)).astype(dtype)
    v = jax.random.normal(keys[2], (batch, steps, heads, value_dim)).astype(dtype)
    decay_shape = (batch, steps, heads, key_dim) if vector_decay else (batch, steps, heads)
    log_decay = -jax.random.uniform(keys[3], decay_shape, minval=0.01, maxval=0.7)
    initial_state = jax.random.normal(keys[4], (batch, heads, key_dim, value_dim))
    cotangents = (jax.random.normal(keys[5], v.shape), jax.random.normal(keys[6], initial_state.shape))
    return (q, k, v, log_decay, initial_state), cotangents


def _outputs_and_grads(impl, args, cotangents, chunk_size, with_initial=True, partition_spec=None):
    """``((o, final_state), grads)``; grads w.r.t. q, k, v, log_decay (and initial_state)."""

    def loss(q, k, v, log_decay, initial_state):
        o, final_state = chunk_gla(
            q, k, v, log_decay, initial_state=initial_state, output_final_state=True,
            chunk_size=chunk_size, impl=impl, partition_spec=partition_spec,
        )
        value = jnp.sum(o.astype(jnp.float32) * cotangents[0]) + jnp.sum(final_state * cotangents[1])
        return value, (o, final_state)

    if not with_initial:
        args = args[:4] + (None,)
    argnums = (0, 1, 2, 3, 4) if with_initial else (0, 1, 2, 3)
    grads, outputs = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))(*args)
    return outputs, grads


def _assert_close(actual, expected, tolerance, what):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert np.all(np.isfinite(actual)), what
    scale = max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance * scale, err_msg=what)


NAMES = ("o", "final_state", "dq", "dk", "dv", "dlog_decay", "dinitial_state")


def _assert_all_close(actual, expected, tolerance, impl):
    for name, value, reference in zip(NAMES, (*actual[0], *actual[1]), (*expected[0], *expected[1])):
        assert value.dtype == reference.dtype, (impl, name)
        _assert_close(value, reference, tolerance, f"{impl}: {name}")


CASES = [
    # (B, T, H, K, V), vector decay, with initial state, dtype
    ((2, 37, 2, 16, 32), False, True, jnp.float32),  # ragged T over 3 chunks, K != V, H > 1
    ((1, 50, 1, 20, 72), True, False, jnp.float32),  # per-channel decay, K and V padded (V: 2 blocks), no initial
    ((1, 1, 2, 16, 16), False, True, jnp.bfloat16),  # T = 1
    ((1, 40, 2, 16, 16), True, True, jnp.bfloat16),
]


@pytest.mark.slow
@pytest.mark.parametrize("shape,vector_decay,with_initial,dtype", CASES)
def test_xla_and_pallas_outputs_final_state_and_all_gradients_match_the_token_oracle(
    shape, vector_decay, with_initial, dtype
):
    args, cotangents = _inputs(*shape, vector_decay, dtype)
    expected = _outputs_and_grads("reference", args, cotangents, 16, with_initial)
    for impl in ("xla", "pallas", "pallas_tpu"):  # pallas_tpu: the Mosaic kernels in interpret mode
        actual = _outputs_and_grads(impl, args, cotangents, 16, with_initial)
        o, final_state = actual[0]
        assert o.dtype == dtype and o.shape == shape[:3] + (shape[4],)
        assert final_state.dtype == jnp.float32
        _assert_all_close(actual, expected, TOLERANCE[dtype], impl)


@pytest.mark.slow
@pytest.mark.parametrize("vector_decay", [False, True])
def test_decays_near_zero_and_one_over_4096_tokens_stay_finite_and_exact(vector_decay):
    args, cotangents = _inputs(1, 4096, 2, 16, 16, vector_decay, seed=1)
    # Head 0 forgets at once (decay e^-30 per token), head 1 hardly forgets (e^-1e-4).
    extremes = jnp.array([-30.0, -1e-4]).reshape(1, 1, 2, *([1] if vector_decay else []))
    args = args[:3] + (jnp.broadcast_to(extremes, args[3].shape),) + args[4:]
    expected = _outputs_and_grads("reference", args, cotangents, 64)
    for impl in ("xla", "pallas", "pallas_tpu"):
        _assert_all_close(_outputs_and_grads(impl, args, cotangents, 64), expected, 1e-4, impl)


def test_scale_defaults_to_inverse_square_root_of_key_width():
    args, _ = _inputs(1, 5, 1, 16, 16, False)
    run = jax.jit(lambda scale: chunk_gla(*args[:4], scale=scale, impl="reference")[0], static_argnums=0)
    default, quarter, half = run(None), run(0.25), run(0.5)  # K = 16: default 16 ** -0.5 = 0.25
    np.testing.assert_allclose(np.asarray(default), np.asarray(quarter), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(half), 2 * np.asarray(quarter), rtol=1e-5, atol=1e-6)


def _bad(**overrides):
    shapes = dict(q=(2, 8, 3, 16), k=(2, 8, 3, 16), v=(2, 8, 3, 32), log_decay=(2, 8, 3))
    args = {name: jnp.zeros(overrides.pop(name, shape)) for name, shape in shapes.items()}
    return {**args, **overrides}


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (_bad(k=(2, 8, 3, 8)), r"k must have shape \[B, T, H, K\] = \(2, 8, 3, 16\), got \(2, 8, 3, 8\)"),
        (_bad(v=(2, 7, 3, 32)), r"v must have shape \[B, T, H, V\] = \(2, 8, 3, '\?'\), got \(2, 7, 3, 32\)"),
        (_bad(q=(2, 8, 16), k=(2, 8, 16)), r"q must have shape \[B, T, H, K\] \(rank 4\), got \(2, 8, 16\)"),
        (_bad(log_decay=(2, 8, 3, 4)), r"log_decay must have shape \[B, T, H\] or \[B, T, H, K\] = \(2, 8, 3, 16\)"),
        (_bad(log_decay=(2, 8, 4)), r"log_decay must have shape \[B, T, H\] = \(2, 8, 3\), got \(2, 8, 4\)"),
        (
            _bad(initial_state=jnp.zeros((2, 3, 32, 16))),
            r"initial_state must have shape \[B, H, K, V\] = \(2, 3, 16, 32\), got \(2, 3, 32, 16\)",
        ),
        (_bad(chunk_size=48), "chunk_size must be a power of two >= 16, got 48"),
        (_bad(partition_spec=P(None, "data")), "must not shard the time axis"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        chunk_gla(**kwargs, impl="pallas")


def test_integer_inputs_are_rejected():
    kwargs = _bad()
    kwargs["v"] = kwargs["v"].astype(jnp.int32)
    with pytest.raises(ValueError, match="v must be a floating-point array"):
        chunk_gla(**kwargs)


@pytest.mark.slow
def test_sharded_batch_and_heads_match_unsharded_without_all_gather():
    # The pallas impl is the one XLA cannot partition; every impl shares the shard_map wrapper.
    impl = "pallas"
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    spec, state_spec = P(("data", "fsdp"), None, "tensor"), P(("data", "fsdp"), "tensor")
    args, cotangents = _inputs(4, 20, 2, 16, 16, False, seed=2)
    expected = _outputs_and_grads(impl, args, cotangents, 16)

    def loss(q, k, v, log_decay, initial_state):
        o, final_state = chunk_gla(
            q, k, v, log_decay, initial_state=initial_state, output_final_state=True,
            chunk_size=16, impl=impl, partition_spec=spec,
        )
        return jnp.sum(o * cotangents[0]) + jnp.sum(final_state * cotangents[1]), (o, final_state)

    with jax.set_mesh(mesh):
        specs = (spec,) * 4 + (state_spec,)
        sharded = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(args, specs)]
        step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)).lower(*sharded).compile()
        grads, outputs = step(*sharded)
    assert outputs[0].sharding.is_equivalent_to(NamedSharding(mesh, spec), 4)
    _assert_all_close((outputs, grads), expected, 1e-6, impl)
    assert "all-gather" not in step.as_text()


def test_tpu_kernels_lower_to_mosaic_forward_and_backward_without_a_tpu():
    """With an abstract TPU as the target, ``auto`` picks the Mosaic kernels, and Pallas's Mosaic
    lowering of both (block shapes, VMEM scratch, reversed index maps, every dot form) runs on CPU
    without libtpu; compiling them is the slow ahead-of-time test's job (tests/seqmodels/tools)."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    def loss(q, k, v, log_decay):
        return jnp.sum(chunk_gla(q, k, v, log_decay, chunk_size=64, impl="auto")[0].astype(jnp.float32) ** 2)

    device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    shapes = [(2, 256, 4, 128), (2, 256, 4, 128), (2, 256, 4, 64), (2, 256, 4)]
    for dtype in (jnp.bfloat16, jnp.float32):
        args = [jax.ShapeDtypeStruct(s, dtype if len(s) == 4 else jnp.float32) for s in shapes]
        with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
            traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(*args)
            text = traced.lower(lowering_platforms=("tpu",)).as_text()
        assert text.count("tpu_custom_call") == 2, dtype  # the forward and the backward kernel
