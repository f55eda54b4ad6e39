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
from seqmodels.models import build_model
from seqmodels.sharding import param_shardings


def abstract_model(config: ModelConfig, seed: int = 0):
    """``(graphdef, abstract nnx.State)`` of the model without allocating its parameters."""
    model = nnx.eval_shape(lambda: build_model(config, seed=seed))
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError("models must hold only nnx.Param variables; found other state: "
                         f"{list(nnx.to_flat_state(rest))[:3]}")
    return graphdef, state


def init_params(config: ModelConfig, seed: int, mesh: Mesh):
    """``(graphdef, params, param_shardings)`` with params initialised sharded on ``mesh``."""
    graphdef, abstract_state = abstract_model(config, seed)
    shardings = param_shardings(abstract_state, mesh)

    def init():
        return nnx.to_pure_dict(nnx.state(build_model(config, seed=seed), nnx.Param))

    params = jax.jit(init, out_shardings=shardings)()
    return graphdef, params, shardings


def init_train_state(config: ModelConfig, seed: int, mesh: Mesh, optimizer):
    """``(graphdef, state, state_shardings)``; optimizer moments follow their parameters' sharding."""
    graphdef, params, shardings = init_params(config, seed, mesh)
    opt_state = jax.jit(optimizer.init)(params)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": opt_state}
    replicated = NamedSharding(mesh, PartitionSpec())
    state_shardings = jax.tree.map(
        lambda x: x.sharding if isinstance(x.sharding, NamedSharding) else replicated, state)
    state = jax.device_put(state, state_shardings)
    return graphdef, state, state_shardings


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))
