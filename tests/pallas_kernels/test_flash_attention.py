"""flash_attention: the Triton kernels (interpret mode) against the explicit-mask oracle on packed
rows, outputs and all gradients; and their lowering to Triton IR for an H200 without a GPU.

Tolerances: float32 differs from the oracle by summation order (online softmax over blocks), 2e-5
absolute on O(1) values; bfloat16 rounds p and the operands of every matmul (2^-8 relative), 3e-2."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.flash_attention import flash_attention


def _inputs(batch, steps, heads, head_dim, dtype, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v, weights = (jax.random.normal(key, (batch, steps, heads, head_dim)) for key in keys)
    segments = np.ones((batch, steps), np.int32)
    segments[0, steps // 3:], segments[0, steps - 9:] = 2, 0  # two documents, then padding
    if batch > 1:
        segments[1, 7:] = 5
    return (q.astype(dtype), k.astype(dtype), v.astype(dtype)), jnp.asarray(segments), weights


def _value_and_grads(impl, qkv, segments, weights, **rule):
    loss = lambda q, k, v: jnp.sum(flash_attention(q, k, v, segments, impl=impl, block_size=16, **rule)
                                   .astype(jnp.float32) * weights)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(*qkv)


FLOAT32, BFLOAT16 = ((2, 100, 2, 24), jnp.float32), ((1, 64, 1, 32), jnp.bfloat16)


# Every mask rule in float32 on a ragged row; bfloat16 (its roundings, whole blocks) once, under the windowed causal
# rule, whose masks are the causal rule's and more (bfloat16 under the causal and bidirectional rules repeated both).
@pytest.mark.slow
@pytest.mark.parametrize("rule, shape, dtype", [
    pytest.param(dict(causal=True), *FLOAT32, id="causal-float32"),
    pytest.param(dict(causal=True, window=20), *FLOAT32, id="window-float32"),
    pytest.param(dict(causal=False), *FLOAT32, id="bidirectional-float32"),
    pytest.param(dict(causal=True, window=20), *BFLOAT16, id="window-bfloat16")])
def test_triton_kernels_match_the_masked_oracle_forward_and_backward(rule, shape, dtype):
    qkv, segments, weights = _inputs(*shape, dtype)
    value, grads = _value_and_grads("pallas", qkv, segments, weights, **rule)
    expected_value, expected_grads = _value_and_grads("reference", qkv, segments, weights, **rule)
    tolerance = 2e-5 if dtype == jnp.float32 else 3e-2
    scale = max(1.0, abs(float(expected_value)))
    assert abs(float(value) - float(expected_value)) <= tolerance * scale * 10
    for name, grad, expected in zip("qkv", grads, expected_grads):
        assert grad.dtype == dtype, name
        bound = tolerance * max(1.0, float(jnp.max(jnp.abs(expected.astype(jnp.float32)))))
        np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(expected, np.float32), atol=bound,
                                   rtol=0, err_msg=f"d{name}")


def test_padding_queries_get_zeros_and_documents_do_not_see_each_other():
    qkv, segments, _ = _inputs(2, 100, 2, 24, jnp.float32)
    out = flash_attention(*qkv, segments, impl="pallas", block_size=16)
    assert np.all(np.asarray(out[0, -9:]) == 0)
    changed = qkv[2].at[0, :33].set(100.0)  # values of row 0's first document only
    again = flash_attention(qkv[0], qkv[1], changed, segments, impl="pallas", block_size=16)
    np.testing.assert_array_equal(np.asarray(again[0, 33:]), np.asarray(out[0, 33:]))


def test_kernels_lower_to_triton_ir_for_an_h200_without_a_gpu():
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    sequence = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
    segments = jax.ShapeDtypeStruct((2, 256), jnp.int32)
    for rule in (dict(causal=True), dict(causal=True, window=100)):
        loss = lambda q, k, v, s: jnp.sum(flash_attention(q, k, v, s, **rule).astype(jnp.float32))
        with jax.sharding.use_abstract_mesh(mesh):
            traced = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(sequence, sequence, sequence, segments)
            text = traced.lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 3, rule  # forward, dq, dk/dv


@pytest.mark.parametrize("kwargs, message", [
    (dict(window=0), "window must be None or a positive int"),
    (dict(block_size=24), "chunk_size must be a power of two"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, message):
    q = jnp.zeros((1, 32, 2, 16))
    with pytest.raises(ValueError, match=message):
        flash_attention(q, q, q, jnp.ones((1, 32), jnp.int32), **kwargs)
    with pytest.raises(ValueError, match="segment_ids must be an integer array"):
        flash_attention(q, q, q, jnp.ones((1, 32)))
