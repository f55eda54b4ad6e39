"""The train state on a mesh: optimizer moments are created in their parameters' sharding."""

import jax
import numpy as np
import pytest
from flax import nnx

from seqmodels.config import MeshConfig, ModelConfig, OptimConfig
from seqmodels.optim.build import build_optimizer
from seqmodels.sharding import make_mesh, param_logical_axes
from seqmodels.models import abstract_model
from seqmodels.training.state import init_train_state, merged_spec


def _state_on_mesh(optimizer_name: str):
    config = ModelConfig(d_model=64, num_heads=4, vocab_size=64, mixers=("attention", "attention"), max_seq_len=32)
    _, abstract_state = abstract_model(config)
    optimizer, _ = build_optimizer(OptimConfig(name=optimizer_name), 10, param_axes=param_logical_axes(abstract_state),
                                   param_shapes=jax.tree.map(lambda x: tuple(x.shape),
                                                             nnx.to_pure_dict(abstract_state)))
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    return init_train_state(config, 0, mesh, optimizer)


def _by_path(tree):
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer_name", ["adamw", "muon"])
def test_every_optimizer_leaf_is_sharded_like_its_parameter_or_is_a_replicated_scalar(optimizer_name):
    _, state, shardings = _state_on_mesh(optimizer_name)
    params = _by_path(state["params"])
    sharded_moments = 0
    for path, leaf in _by_path(state["opt_state"]).items():
        owner = [p for p in params if path.endswith(p)]
        if owner:
            param = params[owner[0]]
            if leaf.shape == param.shape:
                assert leaf.sharding.spec == param.sharding.spec, path
            else:  # Muon's [d_model, H * Dh] view of a [d_model, H, Dh] projection: split as the weight is
                assert leaf.size == param.size, path
                assert leaf.sharding.spec == merged_spec(param.shape, param.sharding.spec, leaf.shape), path
            sharded_moments += any(axis is not None for axis in leaf.sharding.spec)
        else:
            assert leaf.ndim == 0 and all(axis is None for axis in leaf.sharding.spec), (path, leaf.shape)
    # Adam: mu and nu of the embedding and of every projection are split; Muon: its momentum of every
    # projection and Adam's moments of the embedding.
    assert sharded_moments >= {"adamw": 2 * 9, "muon": 8 + 2}[optimizer_name]
    # The declared shardings are the ones the arrays carry (they feed the jitted step's in/out shardings).
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)


def test_fsdp_divides_the_optimizer_state_per_device():
    _, state, _ = _state_on_mesh("adamw")

    def bytes_on_device_0(tree):
        return sum(shard.data.nbytes for leaf in jax.tree.leaves(tree) for shard in leaf.addressable_shards
                   if shard.device == jax.devices()[0])

    def split_bytes(leaf):  # a leaf's bytes over the product of the mesh axes its spec names
        named = [a for entry in leaf.sharding.spec if entry is not None
                 for a in (entry if isinstance(entry, tuple) else (entry,))]
        return leaf.nbytes // int(np.prod([leaf.sharding.mesh.shape[a] for a in named]))

    params, moments = bytes_on_device_0(state["params"]), bytes_on_device_0(state["opt_state"])
    total_params = sum(leaf.nbytes for leaf in jax.tree.leaves(state["params"]))
    assert params == sum(split_bytes(leaf) for leaf in jax.tree.leaves(state["params"]))
    assert params < total_params / 3  # fsdp 4 x tensor 2 split the weights
    # Two moments split as the weights are, and the 0-d step counters whole on every device.
    counters = [leaf for leaf in jax.tree.leaves(state["opt_state"]) if leaf.ndim == 0]
    assert counters and moments == 2 * params + sum(leaf.nbytes for leaf in counters)


def test_merged_spec_keeps_the_split_of_a_run_whose_first_axis_is_split():
    assert merged_spec((64, 4, 16), ("fsdp", "tensor", None), (64, 64)) == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert merged_spec((64, 4, 16), ("fsdp", None, "tensor"), (64, 64)) is None  # split inside a run
    assert merged_spec((64, 4), ("fsdp", None), (32, 8)) is None  # not a merge of neighbouring axes


@pytest.mark.slow
def test_the_initialisation_compiled_at_level_1_gives_the_parameters_of_xla_s_default_level():
    """``init_params`` on CPU compiles at LLVM level 1 (a shorter compile): a layer of each kind of initialiser (the
    projections' truncated normals, Mamba2's log-uniform steps and A, the delta rule's gates, Atlas's memory MLP) comes
    out bit for bit as XLA's default level 3 makes it. (Every registered mixer did too, measured 2026-12-08.)"""
    from seqmodels.models import build_model
    from seqmodels.training.state import INIT_COMPILER_OPTIONS_CPU, init_params
    config = ModelConfig(d_model=32, num_heads=2, vocab_size=64, max_seq_len=32,
                         mixers=("attention", "mamba2", "gated_deltanet", "atlas"))
    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1])
    assert INIT_COMPILER_OPTIONS_CPU == {"xla_backend_optimization_level": 1}
    _, params, _ = init_params(config, 3, mesh)
    default = jax.jit(lambda: nnx.to_pure_dict(nnx.state(build_model(config, seed=3), nnx.Param)))()
    ours, theirs = _by_path(params), _by_path(default)
    assert ours.keys() == theirs.keys() and len(ours) > 4 * 3
    for path, leaf in ours.items():
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(theirs[path]), err_msg=path)
