"""pallas_kernels.momentum_scan: MuonSSM's momentum recurrences and Newton-Schulz closed forms against their oracles."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import chunk_gla, gated_delta_rule, newton_schulz
from pallas_kernels.momentum_scan import block_rank_one_scale, low_rank_newton_schulz, rank_one_scale
from pallas_kernels import momentum_scan

# Jitted: one compile per function is far cheaper on CPU than running the ops eagerly. The chunked
# form is impl "xla"; the token-by-token oracle is impl "reference".
_STATIC = ("scale", "chunk_size", "impl")
momentum_scalar_decay = jax.jit(functools.partial(momentum_scan.momentum_scalar_decay, impl="xla"),
                                static_argnames=_STATIC)
momentum_scalar_decay_reference = jax.jit(functools.partial(momentum_scan.momentum_scalar_decay, impl="reference"),
                                          static_argnames=_STATIC)
momentum_delta_rule = jax.jit(functools.partial(momentum_scan.momentum_delta_rule, impl="xla"),
                              static_argnames=_STATIC)
momentum_delta_rule_reference = jax.jit(functools.partial(momentum_scan.momentum_delta_rule, impl="reference"),
                                        static_argnames=_STATIC)

# float32 throughout: chunked and token-by-token forms differ only in summation order; with
# outputs of magnitude ~10 (sums over 37 tokens, states of magnitude ~1) that is ~1e-5.
FP32_TOL = 2e-4
BATCH, LENGTH, HEADS, KEY, VALUE, CHUNK = 2, 37, 3, 8, 5, 16  # 37 = 2 full chunks + a ragged one


def inputs(seed=0):
    keys = jax.random.split(jax.random.key(seed), 8)
    q = jax.random.normal(keys[0], (BATCH, LENGTH, HEADS, KEY))
    k = jax.random.normal(keys[1], (BATCH, LENGTH, HEADS, KEY))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(keys[2], (BATCH, LENGTH, HEADS, VALUE))
    log_decay = -0.5 * jax.random.uniform(keys[3], (BATCH, LENGTH, HEADS))
    log_momentum = jnp.full((BATCH, LENGTH, HEADS), np.log(0.9)).at[:, 20].set(-30.0)  # a document start
    beta = jax.nn.sigmoid(jax.random.normal(keys[4], (BATCH, LENGTH, HEADS)))
    state = jax.random.normal(keys[5], (BATCH, HEADS, KEY, VALUE))
    momentum = jax.random.normal(keys[6], (BATCH, HEADS, KEY, VALUE))
    return q, k, v, log_decay, log_momentum, beta, state, momentum


def assert_close(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=FP32_TOL, rtol=FP32_TOL)


def test_scalar_decay_chunked_form_matches_the_token_recurrence_with_carried_states():
    q, k, v, log_decay, log_momentum, _, state, momentum = inputs()
    common = dict(scale=0.3, initial_state=state, initial_momentum=momentum)
    chunked = momentum_scalar_decay(q, k, v, log_decay, log_momentum, chunk_size=CHUNK, **common)
    assert_close(chunked, momentum_scalar_decay_reference(q, k, v, log_decay, log_momentum, **common))


@pytest.mark.slow
def test_delta_rule_chunked_form_matches_the_token_recurrence_with_carried_states():
    q, k, v, log_decay, log_momentum, beta, state, momentum = inputs(1)
    common = dict(scale=0.3, initial_state=state, initial_momentum=momentum)
    chunked = momentum_delta_rule(q, k, v, beta, log_decay, log_momentum, chunk_size=CHUNK, **common)
    assert_close(chunked, momentum_delta_rule_reference(q, k, v, beta, log_decay, log_momentum, **common))


@functools.partial(jax.jit, static_argnames="impl")
def backbones(q, k, v, beta, log_decay, state, impl):
    common = dict(scale=0.3, initial_state=state, output_final_state=True, impl=impl)
    return chunk_gla(q, k, v, log_decay, **common), gated_delta_rule(q, k, v, beta, log_decay, **common)


def test_without_momentum_the_chunked_forms_are_the_backbone_kernels():
    q, k, v, log_decay, _, beta, state, _ = inputs(2)
    ssd, delta = backbones(q, k, v, beta, log_decay, state, "reference")
    no_momentum = jnp.full(log_decay.shape, -1e4)  # exp(-1e4) = 0: M_t = W_t
    o, final, _ = momentum_scalar_decay(q, k, v, log_decay, no_momentum, scale=0.3, initial_state=state,
                                        chunk_size=CHUNK)
    assert_close((o, final), ssd)
    o, final, _ = momentum_delta_rule(q, k, beta[..., None] * v, beta, log_decay, no_momentum, scale=0.3,
                                      initial_state=state, chunk_size=CHUNK)
    assert_close((o, final), delta)


@pytest.mark.parametrize("coefficients", ["muon", "polar_express"])
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_rank_one_closed_form_equals_the_newton_schulz_kernel(steps, coefficients):
    u = jax.random.normal(jax.random.key(3), (4, 6)) * jnp.array([[1.0], [1e-3], [30.0], [0.0]])  # one U = 0
    v = jax.random.normal(jax.random.key(4), (4, 5))
    matrices = u[:, :, None] * v[:, None, :]
    scale = rank_one_scale(jnp.sum(u * u, -1) * jnp.sum(v * v, -1), steps=steps, coefficients=coefficients)
    kernel = newton_schulz(matrices, steps=steps, coefficients=coefficients, impl="xla")
    # Entries of NS(U) are <= ~1.2; float32 rounding of the kernel's 5 quintic steps stays below 1e-5.
    np.testing.assert_allclose(scale[:, None, None] * matrices, kernel, atol=2e-5)
    assert float(jnp.abs(kernel).max()) > 0.1  # the comparison is not between zeros


@pytest.mark.parametrize("steps", [1, 5])
def test_block_rank_one_scale_equals_newton_schulz_on_the_block_diagonal_matrix(steps):
    heads, rows, cols = 3, 4, 5
    u = jax.random.normal(jax.random.key(5), (2, heads, rows)) * jnp.array([1.0, 0.1, 5.0])[:, None]
    v = jax.random.normal(jax.random.key(6), (2, heads, cols))
    blocks = u[..., :, None] * v[..., None, :]  # [2, H, rows, cols], rank 1 each
    full = jnp.zeros((2, heads * rows, heads * cols))
    for h in range(heads):
        full = full.at[:, h * rows:(h + 1) * rows, h * cols:(h + 1) * cols].set(blocks[:, h])
    kernel = newton_schulz(full, steps=steps, impl="xla")
    scale = block_rank_one_scale(jnp.sum(u * u, -1) * jnp.sum(v * v, -1), steps=steps, axis=-1)
    for h in range(heads):
        got = scale[:, h, None, None] * blocks[:, h]
        np.testing.assert_allclose(got, kernel[:, h * rows:(h + 1) * rows, h * cols:(h + 1) * cols], atol=2e-5)
    # Blocks are normalised together, so a block's scale differs from its own rank_one_scale.
    alone = rank_one_scale(jnp.sum(u * u, -1) * jnp.sum(v * v, -1), steps=steps)
    assert not np.allclose(scale, alone, rtol=1e-2)
    one_block = block_rank_one_scale(jnp.sum(u * u, -1)[:, :1], steps=steps)
    np.testing.assert_allclose(one_block[:, 0], rank_one_scale(jnp.sum(u * u, -1)[:, 0], steps=steps), rtol=1e-6)


def test_rank_one_scale_is_the_identity_for_zero_steps_and_has_finite_gradients_at_zero():
    sum_squares = jnp.array([0.0, 1e-12, 4.0])
    assert rank_one_scale(sum_squares, steps=0).tolist() == [1.0, 1.0, 1.0]
    grads = jax.grad(lambda s: rank_one_scale(s, steps=2).sum())(sum_squares)
    assert np.isfinite(np.asarray(grads)).all()


def test_low_rank_core_equals_newton_schulz_on_the_full_matrix():
    left = jax.random.normal(jax.random.key(5), (2, 7, 3))
    right = jax.random.normal(jax.random.key(6), (2, 5, 3))
    core = low_rank_newton_schulz(left, right, steps=3)
    full = newton_schulz(left @ jnp.swapaxes(right, -1, -2), steps=3, impl="xla")
    np.testing.assert_allclose(left @ core @ jnp.swapaxes(right, -1, -2), full, atol=2e-5)
    with pytest.raises(ValueError, match="must share the rank r"):
        low_rank_newton_schulz(left, right[..., :2], steps=1)


def test_wrong_shapes_and_arguments_are_named_before_tracing():
    q, k, v, log_decay, log_momentum, beta, state, _ = inputs()
    with pytest.raises(ValueError, match=r"log_momentum_decay must have shape \[B, T, H\]"):
        momentum_scan.momentum_scalar_decay(q, k, v, log_decay, log_momentum[:, :5], scale=1.0)
    with pytest.raises(ValueError, match=r"k must have shape \[B, T, H, K\]"):
        momentum_scan.momentum_delta_rule(q, k[..., :3], v, beta, log_decay, log_momentum, scale=1.0)
    with pytest.raises(ValueError, match=r"initial_momentum must have shape \[B, H, K, V\]"):
        momentum_scan.momentum_scalar_decay(q, k, v, log_decay, log_momentum, scale=1.0, initial_momentum=state[0])
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        momentum_scan.momentum_scalar_decay(q, k, v, log_decay, log_momentum, scale=1.0, chunk_size=0)
    with pytest.raises(ValueError, match="impl must be one of"):
        momentum_scan.momentum_delta_rule(q, k, v, beta, log_decay, log_momentum, scale=1.0, impl="triton")


def test_auto_and_pallas_run_the_chunked_form():
    q, k, v, log_decay, log_momentum, _, state, _ = inputs()
    common = dict(scale=0.3, initial_state=state, chunk_size=CHUNK)
    chunked = momentum_scan.momentum_scalar_decay(q, k, v, log_decay, log_momentum, impl="xla", **common)
    for impl in ("auto", "pallas"):
        got = momentum_scan.momentum_scalar_decay(q, k, v, log_decay, log_momentum, impl=impl, **common)
        for g, c in zip(got, chunked):
            np.testing.assert_array_equal(g, c)
