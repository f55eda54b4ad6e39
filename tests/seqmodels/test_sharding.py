"""Sharded training on 8 simulated CPU devices equals one device; parameters sharded as the rules say."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from seqmodels.config import MeshConfig, ModelConfig
from seqmodels.mixers.attention import AttentionConfig
from seqmodels.sharding import logical_spec, make_mesh
from seqmodels.training.state import init_params

CONFIG = ModelConfig(d_model=64, num_heads=4, mixers=("attention", "swa"), max_seq_len=64,
                     attention=AttentionConfig(num_kv_heads=2), tie_embeddings=False)


def batch():
    key = jax.random.key(0)
    tokens = jax.random.randint(key, (8, 33), 0, 256)
    segments = jnp.concatenate([jnp.ones((8, 20), jnp.int32), 2 * jnp.ones((8, 12), jnp.int32)], axis=1)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": segments,
            "loss_mask": jnp.ones((8, 32))}


def loss_and_grads(mesh):
    with jax.set_mesh(mesh):
        graphdef, params, shardings = init_params(CONFIG, 0, mesh)
        data_sharding = NamedSharding(mesh, logical_spec(("batch", None)))
        data = jax.device_put(batch(), data_sharding)

        @jax.jit
        def step(params, data):
            def mean_loss(p):
                loss_sum, count = nnx.merge(graphdef, p).loss(data)
                return loss_sum / count
            return jax.value_and_grad(mean_loss)(params)

        loss, grads = step(params, data)
        return jax.device_get((params, loss, grads)), params


@pytest.fixture(scope="module")
def single_device():
    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1])
    return loss_and_grads(mesh)[0]


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_sharded_loss_and_gradients_equal_one_device(single_device, sizes):
    assert len(jax.devices()) == 8
    mesh = make_mesh(MeshConfig(*sizes))
    (params, loss, grads), _ = loss_and_grads(mesh)
    ref_params, ref_loss, ref_grads = single_device
    jax.tree.map(np.testing.assert_array_equal, params, ref_params)  # sharded init draws the same values
    # float32 with different reduction orders across shards: 1e-5 relative.
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, ref_grads)


def test_parameters_are_sharded_as_the_rules_table_says():
    mesh = make_mesh(MeshConfig(2, 2, 2))
    _, params = loss_and_grads(mesh)
    attention = params["blocks"][0]["mixer"]
    expected = {
        "embed": (params["embed"], P("tensor", "fsdp")),  # [vocab, embed]
        "head": (params["head"], P("fsdp", "tensor")),  # [embed, vocab]
        "query": (attention["query"]["kernel"], P("fsdp", "tensor", None)),  # [embed, heads, head_dim]
        "key": (attention["key"]["kernel"], P("fsdp", "tensor", None)),  # [embed, kv_heads, head_dim]
        "out": (attention["out"]["kernel"], P("tensor", None, "fsdp")),  # [heads, head_dim, embed]
        "mlp_down": (params["blocks"][1]["mlp"]["down"]["kernel"], P("tensor", "fsdp")),  # [mlp, embed]
        "norm": (params["final_norm"]["scale"], P("fsdp")),  # [embed]
    }
    for name, (array, spec) in expected.items():
        assert array.sharding.spec == spec, (name, array.sharding.spec)
        local = array.addressable_shards[0].data.shape
        split = [1 if s is None else mesh.shape[s] for s in spec]
        assert local == tuple(n // k for n, k in zip(array.shape, split)), name


def test_logical_spec_leaves_indivisible_dimensions_replicated():
    mesh = make_mesh(MeshConfig(2, 2, 2))
    assert logical_spec(("vocab", "embed"), (321, 64), mesh) == P(None, "fsdp")
    assert logical_spec(("batch", None), (8, 5), mesh) == P(("data", "fsdp"), None)


def test_mesh_sizes_must_multiply_to_the_device_count():
    with pytest.raises(ValueError, match="multiply to 12, but there are 8 devices"):
        make_mesh(MeshConfig(3, 4, 1))
    assert make_mesh(MeshConfig(-1, 2, 2)).shape["data"] == 2
