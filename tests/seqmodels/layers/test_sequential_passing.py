"""The Atlas memory over a sequence split into 4 shards run in sequence equals the op on the whole row,
outputs, final memory and gradients, for Atlas and its Titans and OmegaNet cases, on packed rows whose
documents cross shard boundaries, start inside a shard and at a shard's edge."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from pallas_kernels.atlas_memory import AtlasInputs, AtlasSettings, MemoryLayout, atlas_memory
from pallas_kernels.newton_schulz.coefficients import resolve_coefficients
from seqmodels.config import MeshConfig
from seqmodels.layers.sequential_passing import split_atlas_memory
from seqmodels.sharding import make_mesh

BATCH, LENGTH, HEADS, DIM = 2, 32, 2, 4  # 8 tokens per shard at mesh.context = 4: two chunks of 4
# Row 0: document 2 covers tokens 5-18 (it crosses two shard boundaries), document 3 starts inside shard 2.
# Row 1: document 2 starts at shard 2's edge (token 16) and the row ends in padding.
SEGMENTS = jnp.asarray([[1] * 5 + [2] * 14 + [3] * 13, [1] * 16 + [2] * 10 + [0] * 6], jnp.int32)
GATE_RANGES = ((0.9, 1.0), (0.0, 0.9), (0.0, 0.3), (0.0, 1.0))  # alpha, theta, eta, gamma

CASES = {
    # Titans: window 1, identity features, linear memory, no Newton-Schulz, eta on the gradient
    "titans": (MemoryLayout(DIM, DIM), dict(window=1, ns_steps=0)),
    # OmegaNet: a window of 6 over chunks of 4 (it reaches back into the previous shard), deep memory
    "omeganet": (MemoryLayout(DIM, DIM, 2 * DIM), dict(window=6, ns_steps=0)),
    # Atlas: deep memory, Newton-Schulz (k = 5) with eta on the update, window 3
    "atlas": (MemoryLayout(DIM, DIM, 2 * DIM), dict(window=3, ns_steps=5, eta_scales="update")),
    # Atlas with Newton-Schulz once per chunk (the dual form), clipped inner gradients
    "atlas-chunk": (MemoryLayout(DIM, DIM, 2 * DIM), dict(window=3, ns_steps=5, eta_scales="update",
                                                          ns_granularity="chunk", grad_clip=0.5)),
}


def make_case(name, seed=0):
    layout, rule = CASES[name]
    settings = AtlasSettings(layout, chunk_size=4, **rule)
    keys = jax.random.split(jax.random.key(seed), 8)

    def unit(key):
        x = jax.random.normal(key, (BATCH, LENGTH, HEADS, DIM))
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    gates = [low + (high - low) * jax.random.uniform(keys[3 + i], (BATCH, LENGTH, HEADS))
             for i, (low, high) in enumerate(GATE_RANGES)]
    inputs = AtlasInputs(unit(keys[0]), jax.random.normal(keys[1], (BATCH, LENGTH, HEADS, DIM)), unit(keys[2]),
                         *gates, SEGMENTS)
    initial = tuple(0.3 * jax.random.normal(key, (HEADS, m, n))
                    for key, (m, n) in zip(jax.random.split(keys[7], 2), layout.shapes))
    return inputs, initial, settings


def tolerance(settings):
    # float32, the same operations as on one device: ~1e-6 relative without Newton-Schulz; with it, rounding
    # amplified by up to the product of the steps' a coefficients (as tests/pallas_kernels/test_atlas_memory.py)
    if not settings.ns_steps:
        return 1e-5
    schedule, _ = resolve_coefficients(settings.ns_coefficients, settings.ns_steps)
    return 20 * 1e-7 * math.prod(a for a, _, _ in schedule)


@functools.cache
def outputs_and_grads(split: bool, settings: AtlasSettings):
    """jit of ``((y, M_T), grads of sum(y w) + sum(M_T) wrt the float inputs and M_0)``."""
    def objective(floats, initial, segment_ids, weights):
        inputs = AtlasInputs(*floats, segment_ids)
        if split:
            y, memory = split_atlas_memory(inputs, initial, settings, impl="xla")
        else:
            y, memory = atlas_memory(inputs, initial, settings, impl="xla", return_memory=True)
        return jnp.sum(y * weights) + sum(jnp.sum(m) for m in memory), (y, memory)
    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))


def run(split, inputs, initial, settings):
    weights = jax.random.normal(jax.random.key(9), inputs.values.shape)
    (_, outputs), grads = outputs_and_grads(split, settings)(tuple(inputs[:7]), initial, inputs.segment_ids,
                                                             weights)
    return jax.device_get((outputs, grads))


def assert_close(got, want, settings):
    scale = tolerance(settings)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=0, atol=scale * max(float(np.abs(b).max()), 1e-3))


def split_run(inputs, initial, settings, *, data=2):
    mesh = make_mesh(MeshConfig(data=data, fsdp=1, tensor=1, context=4), devices=jax.devices()[:4 * data])
    with jax.set_mesh(mesh):
        sequence = NamedSharding(mesh, P("data", "context"))
        placed = inputs._replace(**{name: jax.device_put(getattr(inputs, name), sequence)
                                    for name in AtlasInputs._fields[:8]})
        return run(True, placed, initial, settings)


# 10-20 s each on 2 busy cores (two compiles of the op's forward and backward). OmegaNet, in the fast tier,
# crosses the shards with all of the state: memory, momentum and a window reaching into the previous shard.
SLOW_CASES = {"titans", "omeganet", "atlas", "atlas-chunk"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CASES else name
                                  for name in CASES])
def test_shards_in_sequence_equal_the_whole_row_outputs_memory_and_gradients(name):
    """On mesh.data = 2 x mesh.context = 4: each row on its own 4 shards."""
    inputs, initial, settings = make_case(name)
    assert_close(split_run(inputs, initial, settings), run(False, inputs, initial, settings), settings)


def test_the_incoming_state_matters_here():
    """A check of the test itself: shard c run from the initial state instead of shard c - 1's differs."""
    inputs, initial, settings = make_case("titans")
    (y, _), _ = run(False, inputs, initial, settings)
    shard = slice(8, 16)  # the second shard, run alone from M_0, its first token starting a document
    alone = atlas_memory(AtlasInputs(*(x[:, shard] for x in inputs[:8])), initial, settings, impl="xla")
    assert float(np.abs(np.asarray(alone) - y[:, shard]).max()) > 100 * tolerance(settings)


def test_shards_off_the_chunk_grid_are_refused():
    inputs, initial, settings = make_case("titans")
    off_grid = AtlasSettings(settings.layout, window=1, chunk_size=3, ns_steps=0)
    mesh = make_mesh(MeshConfig(data=1, fsdp=1, tensor=1, context=4), devices=jax.devices()[:4])
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="multiple of model.atlas.chunk_size=3"):
        split_atlas_memory(inputs, initial, off_grid, impl="xla")
