"""State passing over a sequence split into 4 shards equals each op on the whole sequence, outputs and
gradients, with O(1) inputs and documents that start inside and at the edges of the shards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from pallas_kernels import chunk_gla, gated_delta_rule
from pallas_kernels.linear_scan import linear_scan
from pallas_kernels.momentum_scan import momentum_delta_rule, momentum_scalar_decay
from seqmodels.config import MeshConfig
from seqmodels.layers.segments import reset_at_document_starts
from seqmodels.layers.state_passing import (split_chunk_gla, split_gated_delta_rule, split_linear_scan,
                                            split_momentum_scan)
from seqmodels.sharding import make_mesh

BATCH, LENGTH, HEADS, KEYS, VALUES = 2, 64, 2, 8, 4
SEGMENTS = jnp.asarray([[1] * 10 + [2] * 22 + [3] * 32, [1] * 40 + [2] * 24])  # starts at 10, 32 (an edge), 40


def inputs(seed=0):
    keys = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(keys[0], (BATCH, LENGTH, HEADS, KEYS))
    k = jax.random.normal(keys[1], (BATCH, LENGTH, HEADS, KEYS))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(keys[2], (BATCH, LENGTH, HEADS, VALUES))
    beta = jax.nn.sigmoid(jax.random.normal(keys[3], (BATCH, LENGTH, HEADS)))
    # mild decays, so that the state entering a shard matters over all of its 16 tokens
    log_decay = reset_at_document_starts(-0.05 * jax.nn.sigmoid(jax.random.normal(keys[4], (BATCH, LENGTH, HEADS))),
                                         SEGMENTS)
    log_momentum = reset_at_document_starts(jnp.full((BATCH, LENGTH, HEADS), np.log(0.9)), SEGMENTS)
    return q, k, v, beta, log_decay, log_momentum


def cases():
    common = dict(chunk_size=16, impl="xla")
    return {
        "chunk_gla_per_head_decay": (
            lambda q, k, v, beta, g, m: chunk_gla(q, k, v, g, scale=0.5, **common)[0],
            lambda q, k, v, beta, g, m: split_chunk_gla(q, k, v, g, scale=0.5, **common)),
        "chunk_gla_per_key_decay": (
            lambda q, k, v, beta, g, m: chunk_gla(q, k, v, g[..., None] * jnp.linspace(0.5, 1.5, KEYS), **common)[0],
            lambda q, k, v, beta, g, m: split_chunk_gla(q, k, v, g[..., None] * jnp.linspace(0.5, 1.5, KEYS),
                                                        scale=KEYS ** -0.5, **common)),
        "gated_delta_rule": (
            lambda q, k, v, beta, g, m: gated_delta_rule(q, k, v, beta, g, **common)[0],
            lambda q, k, v, beta, g, m: split_gated_delta_rule(q, k, v, beta, g, scale=None, **common)),
        "delta_rule_without_decay": (
            lambda q, k, v, beta, g, m: gated_delta_rule(q, k, v, beta, None, **common)[0],
            lambda q, k, v, beta, g, m: split_gated_delta_rule(q, k, v, beta, None, scale=None, **common)),
        "momentum_scalar_decay": (
            lambda q, k, v, beta, g, m: momentum_scalar_decay(q, k, v, g, m, scale=1.0, **common)[0],
            lambda q, k, v, beta, g, m: split_momentum_scan(momentum_scalar_decay, q, k, v, (g, m), scale=1.0,
                                                            **common)),
        "momentum_delta_rule": (
            lambda q, k, v, beta, g, m: momentum_delta_rule(q, k, v, beta, g, m, scale=0.5, **common)[0],
            lambda q, k, v, beta, g, m: split_momentum_scan(momentum_delta_rule, q, k, v, (beta, g, m), scale=0.5,
                                                            **common)),
        "linear_scan": (
            lambda q, k, v, beta, g, m: linear_scan(jnp.exp(g)[..., None] * jnp.ones(KEYS), q, impl="xla"),
            lambda q, k, v, beta, g, m: split_linear_scan(jnp.exp(g)[..., None] * jnp.ones(KEYS), q, impl="xla")),
    }


@pytest.mark.parametrize("name", sorted(cases()))
def test_state_passing_over_four_shards_equals_the_whole_sequence(name):
    whole, split = cases()[name]
    args = inputs()
    cotangent = jax.random.normal(jax.random.key(9), jax.eval_shape(whole, *args).shape)

    def loss(fn):
        return lambda *args: jnp.sum(fn(*args) * cotangent)

    # the reference as one program (not op by op): the same values, one compile
    expected = jax.jit(lambda *a: (whole(*a), jax.grad(loss(whole), argnums=tuple(range(6)))(*a)))(*args)
    mesh = make_mesh(MeshConfig(data=1, context=4), devices=jax.devices()[:4])
    with jax.set_mesh(mesh):
        placed = jax.device_put(args, NamedSharding(mesh, P(None, "context")))
        got = jax.jit(lambda *a: (split(*a), jax.grad(loss(split), argnums=tuple(range(6)))(*a)))(*placed)
    # float32: the chained states and the correction reorder sums over 64 tokens of O(1) inputs
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(expected[0]), rtol=1e-4, atol=1e-4)
    for got_grad, expected_grad in zip(got[1], expected[1]):
        np.testing.assert_allclose(np.asarray(got_grad), np.asarray(expected_grad), rtol=1e-4, atol=1e-4)
    # the state entering a shard matters: dropping it changes the outputs by far more than the tolerance
    alone = jax.jit(whole)(*(a[:, 16:32] for a in args))  # shard 1 run from the zero state
    assert float(jnp.max(jnp.abs(expected[0][:, 16:32] - alone))) > 1e-2
