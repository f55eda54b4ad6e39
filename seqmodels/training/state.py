"""The train state, ``{"step", "params", "opt_state"}``, created directly in its sharded layout.

``params`` is a pure nested dict of arrays (``nnx.to_pure_dict``) and the model's static structure
is a ``GraphDef``: ``nnx.merge(graphdef, params)`` is the model. Parameters are initialised inside
``jax.jit(out_shardings=...)`` so no device ever holds the whole model unsharded.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from seqmodels.config import ModelConfig
from seqmodels.models import abstract_model, build_model
from seqmodels.models.trainable import trainable_part
from seqmodels.sharding import param_shardings


# The initialisation runs once per run, so on CPU its program (a threefry draw and a truncated normal per parameter,
# about as long to compile as a tiny model's train step) is compiled at LLVM optimisation level 1 instead of XLA's 3,
# with the same parameters bit for bit (tests/seqmodels/training/test_state.py compares them). Measured 2026-12-08 on
# 2 cores, one compile each: 4.7 -> 2.9 s for two attention layers at d_model 32 and 7.1 -> 5.2 s for two
# gated_deltanet layers at d_model 64 (beside the test suite), 6.3-6.8 -> 5.4 s for the 125M model (12 attention
# layers, d_model 768, vocabulary 32,000; idle). Level 0 would change the parameters (no fused multiply-adds).
INIT_COMPILER_OPTIONS_CPU = {"xla_backend_optimization_level": 1}


def init_params(config: ModelConfig, seed: int, mesh: Mesh):
    """``(graphdef, params, param_shardings)`` with params initialised sharded on ``mesh``."""
    graphdef, abstract_state = abstract_model(config, seed)
    shardings = param_shardings(abstract_state, mesh)

    def init():
        return nnx.to_pure_dict(nnx.state(build_model(config, seed=seed), nnx.Param))

    on_cpu = all(device.platform == "cpu" for device in mesh.devices.flat)
    params = jax.jit(init, out_shardings=shardings, compiler_options=INIT_COMPILER_OPTIONS_CPU if on_cpu else None)()
    return graphdef, params, shardings


def optimizer_state_shardings(abstract_opt_state, params, param_shardings: dict, mesh: Mesh):
    """The sharding of every optimizer-state leaf: its parameter's, or replicated.

    An optimizer state holds, for each parameter, leaves under a key path that ends with the
    parameter's own path (``mu/blocks/0/mixer/query/kernel`` for ``blocks/0/mixer/query/kernel``,
    whatever the optimizer's nesting), of the parameter's shape or of that shape with neighbouring
    axes merged (Muon keeps ``[d_model, H, Dh]`` projections as ``[d_model, H * Dh]`` matrices). Such a
    leaf takes the parameter's sharding (``merged_spec``), so fsdp and tensor parallelism split the
    moments exactly as they split the weights; every other leaf (step counts, scalars, statistics of
    another shape) is replicated.
    """
    by_path = {tuple(path): (leaf.shape, sharding) for (path, leaf), sharding in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(param_shardings))}
    lengths = sorted({len(path) for path in by_path}, reverse=True)
    replicated = NamedSharding(mesh, PartitionSpec())

    def choose(path, leaf):
        for length in lengths:
            match = by_path.get(tuple(path[-length:])) if len(path) >= length else None
            if match is not None:
                spec = merged_spec(tuple(match[0]), tuple(match[1].spec), tuple(leaf.shape))
                return replicated if spec is None else NamedSharding(mesh, spec)
        return replicated

    return jax.tree_util.tree_map_with_path(choose, abstract_opt_state)


def merged_spec(shape: tuple, spec: tuple, merged_shape: tuple) -> PartitionSpec | None:
    """The spec of ``merged_shape`` (``shape`` with runs of neighbouring axes merged) laid out as ``spec``
    lays out ``shape``, or None when the layouts differ.

    A merged axis keeps the split of its first axis when the others of its run are whole: rows of
    a ``[H, Dh]`` block split over H are contiguous runs of ``H * Dh``, so the shards hold the same
    numbers either way.
    """
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    result, axis = [], 0
    for size in merged_shape:
        run, product = [], 1
        while axis < len(shape) and (product < size or (not run and shape[axis] == size)):
            run.append(axis)
            product *= shape[axis]
            axis += 1
        if product != size or any(spec[i] is not None for i in run[1:]):
            return None
        result.append(spec[run[0]] if run else None)
    return PartitionSpec(*result) if axis == len(shape) else None


def init_train_state(config: ModelConfig, seed: int, mesh: Mesh, optimizer, trainable=None):
    """``(graphdef, state, state_shardings)``; optimizer moments are created in their parameters' sharding,
    for the parameters ``trainable`` selects (all when None)."""
    graphdef, params, shardings = init_params(config, seed, mesh)
    trained, trained_shardings = trainable_part(params, trainable), trainable_part(shardings, trainable)
    abstract_opt_state = jax.eval_shape(optimizer.init, trained)
    opt_shardings = optimizer_state_shardings(abstract_opt_state, trained, trained_shardings, mesh)
    opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(trained)
    replicated = NamedSharding(mesh, PartitionSpec())
    state = {"step": jax.device_put(jnp.zeros((), jnp.int32), replicated), "params": params, "opt_state": opt_state}
    state_shardings = {"step": replicated, "params": shardings, "opt_state": opt_shardings}
    return graphdef, state, state_shardings


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))
