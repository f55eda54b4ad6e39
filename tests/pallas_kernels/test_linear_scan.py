"""linear_scan: every impl against the lax.scan oracle, forward and all gradients.

Tolerances: float32 paths differ from the oracle only by summation order (associative scan) or
not at all (the Pallas kernel runs the same sequential recurrence), so 2e-5 relative to the
largest magnitude. bfloat16 inputs are scanned in float32 and the result rounded once to bfloat16
(relative step 2^-8); the backward also reads the bfloat16 forward output, so 2e-2.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels import linear_scan

TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}


def _inputs(shape, dtype, seed=0, with_initial=True):
    key_a, key_b, key_init, key_cot = jax.random.split(jax.random.PRNGKey(seed), 4)
    a = jax.random.uniform(key_a, shape, minval=-1.0, maxval=1.0).astype(dtype)
    b = jax.random.normal(key_b, shape).astype(dtype)
    initial = jax.random.normal(key_init, (shape[0],) + shape[2:]) if with_initial else None
    cotangent = jax.random.normal(key_cot, shape)
    return a, b, initial, cotangent


def _value_and_grads(impl, a, b, initial, cotangent, reverse):
    def loss(a, b, initial):
        h = linear_scan(a, b, initial=initial, reverse=reverse, impl=impl)
        return jnp.sum(h.astype(jnp.float32) * cotangent), h

    argnums = (0, 1) if initial is None else (0, 1, 2)
    grad_fn = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))
    grads, h = grad_fn(a, b, initial)
    return h, grads


def _assert_close(actual, expected, tolerance, what):
    actual = np.asarray(actual, np.float32)
    expected = np.asarray(expected, np.float32)
    scale = max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance * scale, err_msg=what)


CASES = [
    # (shape [B, T, ...], reverse, with initial, dtype)
    ((2, 37, 3, 5), False, True, jnp.float32),  # trailing axes flattened, T not a multiple of the block
    ((2, 9, 40), True, True, jnp.float32),  # channels padded to a multiple of the block
    ((1, 1, 4), False, False, jnp.bfloat16),  # T = 1
]


@pytest.mark.slow
@pytest.mark.parametrize("shape,reverse,with_initial,dtype", CASES)
def test_xla_and_pallas_forward_and_all_gradients_match_the_sequential_oracle(shape, reverse, with_initial, dtype):
    a, b, initial, cotangent = _inputs(shape, dtype, with_initial=with_initial)
    h_ref, grads_ref = _value_and_grads("reference", a, b, initial, cotangent, reverse)
    for impl in ("xla", "pallas"):
        h, grads = _value_and_grads(impl, a, b, initial, cotangent, reverse)
        assert h.dtype == dtype and h.shape == shape
        tolerance = TOLERANCE[dtype]
        _assert_close(h, h_ref, tolerance, f"{impl}: h")
        for name, grad, grad_ref in zip(("da", "db", "dinitial"), grads, grads_ref):
            assert grad.dtype == grad_ref.dtype
            _assert_close(grad, grad_ref, tolerance, f"{impl}: {name}")


@pytest.mark.parametrize("reverse", [False, True])
def test_a_decay_per_row_equals_the_decay_broadcast_over_the_last_axis(reverse):
    """``a [B, T, H, 1]`` beside ``b [B, T, H, D]``: every impl gives the scan of the broadcast decay, and the
    decay's gradient is the broadcast one's summed over the last axis."""
    shape = (2, 13, 3, 6)
    a, b, initial, cotangent = _inputs(shape, jnp.float32)
    per_row = a[..., :1]
    h_full, grads_full = _value_and_grads("reference", jnp.broadcast_to(per_row, shape), b, initial, cotangent,
                                          reverse)
    for impl in ("reference", "xla", "pallas"):
        h, grads = _value_and_grads(impl, per_row, b, initial, cotangent, reverse)
        assert h.shape == shape and grads[0].shape == per_row.shape
        _assert_close(h, h_full, TOLERANCE[jnp.float32], f"{impl}: h")
        _assert_close(grads[0], jnp.sum(grads_full[0], axis=-1, keepdims=True), TOLERANCE[jnp.float32],
                      f"{impl}: da")
        for name, grad, grad_full in zip(("db", "dinitial"), grads[1:], grads_full[1:]):
            _assert_close(grad, grad_full, TOLERANCE[jnp.float32], f"{impl}: {name}")


def test_reverse_scan_runs_from_the_end_with_the_initial_state_after_the_last_step():
    a = jnp.full((1, 3, 1), 0.5)
    b = jnp.array([1.0, 2.0, 4.0]).reshape(1, 3, 1)
    h = linear_scan(a, b, initial=jnp.array([[8.0]]), reverse=True, impl="pallas")
    # h_2 = 0.5*8 + 4 = 8, h_1 = 0.5*8 + 2 = 6, h_0 = 0.5*6 + 1 = 4
    np.testing.assert_allclose(np.asarray(h).ravel(), [4.0, 6.0, 8.0])


def test_decays_near_zero_and_one_over_4096_steps_stay_finite_and_agree():
    shape = (1, 4096, 16)
    log_a = jnp.where(jnp.arange(16) < 8, -30.0, -1e-4)  # half the channels forget, half remember
    a = jnp.broadcast_to(jnp.exp(log_a), shape)
    b = jax.random.normal(jax.random.PRNGKey(1), shape)
    initial = jnp.ones((1, 16))
    cotangent = jnp.ones(shape)
    h_ref, grads_ref = _value_and_grads("reference", a, b, initial, cotangent, False)
    for impl in ("xla", "pallas"):
        h, grads = _value_and_grads(impl, a, b, initial, cotangent, False)
        for value, expected in zip((h, *grads), (h_ref, *grads_ref)):
            assert np.all(np.isfinite(np.asarray(value)))
            _assert_close(value, expected, 1e-4, f"{impl}: decay extremes")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(a=jnp.zeros((2, 5, 3)), b=jnp.zeros((2, 4, 3))), r"b must have shape .*\(2, 5, 3\), got \(2, 4, 3\)"),
        (dict(a=jnp.zeros((5,)), b=jnp.zeros((5,))), r"a must have shape \[B, T, \.\.\.\] .*got \(5,\)"),
        (dict(a=jnp.zeros((2, 5, 3, 2)), b=jnp.zeros((2, 5, 3, 4))), r"b must have shape .*a decay per row"),
        (dict(a=jnp.zeros((2, 5), jnp.int32), b=jnp.zeros((2, 5))), "a must be a floating-point array"),
        (
            dict(a=jnp.zeros((2, 5, 3)), b=jnp.zeros((2, 5, 3)), initial=jnp.zeros((2, 4))),
            r"initial must have shape \[B, \.\.\.\] .*\(2, 3\), got \(2, 4\)",
        ),
        (
            dict(a=jnp.zeros((2, 5, 3)), b=jnp.zeros((2, 5, 3)), partition_spec=P("data", "fsdp")),
            "must not shard the time axis",
        ),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        linear_scan(**kwargs, impl="pallas")


@pytest.mark.slow
def test_sharded_batch_and_heads_match_unsharded_without_all_gather():
    # The pallas impl is the one XLA cannot partition; every impl shares the shard_map wrapper.
    impl = "pallas"
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    spec = P(("data", "fsdp"), None, "tensor")
    a, b, initial, cotangent = _inputs((4, 11, 2, 8), jnp.float32, seed=3)

    def loss(a, b, initial, partition_spec):
        h = linear_scan(a, b, initial=initial, impl=impl, partition_spec=partition_spec)
        return jnp.sum(h * cotangent), h

    grad_fn = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)
    grads_ref, h_ref = jax.jit(grad_fn, static_argnums=3)(a, b, initial, None)
    with jax.set_mesh(mesh):
        sharded = [jax.device_put(x, NamedSharding(mesh, spec)) for x in (a, b)]
        initial_sharded = jax.device_put(initial, NamedSharding(mesh, P(("data", "fsdp"), "tensor")))
        step = jax.jit(grad_fn, static_argnums=3).lower(*sharded, initial_sharded, spec).compile()
        grads, h = step(*sharded, initial_sharded)
    assert h.sharding.is_equivalent_to(NamedSharding(mesh, spec), h.ndim)
    _assert_close(h, h_ref, 1e-6, "h")
    for grad, grad_ref in zip(grads, grads_ref):
        _assert_close(grad, grad_ref, 1e-6, "grad")
    assert "all-gather" not in step.as_text()
