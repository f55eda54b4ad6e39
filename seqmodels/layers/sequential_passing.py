"""The Atlas memory over a sequence split by ``mesh.context``: the shards run in sequence.

The Atlas memory (Atlas, and Titans and OmegaNet as its special cases: ``pallas_kernels.atlas_memory``)
updates its memory by gradients taken at the memory itself, orthogonalised by Newton-Schulz: the state
leaving a shard is not an affine map of the state entering it, so the prefix scan of the linear
recurrences (``state_passing``) does not apply. The shards run one after another instead, each from the
state the previous one leaves, in C rounds (C = ``mesh.context``):

    round r = 0 .. C - 1:
        shard r runs the memory op on its T / C tokens from its incoming state -> (outputs, state out)
        (shard 0 from the op's initial state: M_0, no momentum, an empty window)
        every shard sends its state out to the next (one ppermute); shard r + 1 keeps it as its incoming state

The state (``atlas_memory``'s ``initial_state`` / ``return_state``, the decoding state) holds all that
crosses a shard boundary: the memory, the momentum and the Omega window, the last c tokens' features,
values and weights of the current document. Shard boundaries must lie on the chunk grid (``T / C`` a
multiple of ``model.atlas.chunk_size``), so each shard's chunks are the row's. A document that starts
inside a shard resets the memory there as on one device; the shard's first token continues the incoming
document only where its segment id equals the previous shard's last (a one-token halo), else it starts one.

In round r only shard r works (``lax.cond`` on the shard index; the others pass their state through), so
after round r shard r's outputs are final and every device runs its shard's pass once.

Cost per layer: each device does one shard's memory op (its share of the FLOPs), but the rounds follow one
another, so the layer's memory op takes C times as long as one shard's pass (the time of the whole row on
one device), forward and backward; plus C ppermutes of the state per direction, float32 per row and head
``2 P + c (F + V + 1)`` values (memory and momentum of ``P`` weights, the window). The short convolutions
take their usual halo (``seqmodels.layers.conv``); everything else in the layer stays parallel.

The backward is autodiff of the same program: the rounds run in reverse, each ppermute transposing to the
reverse shift, so a shard's state gradient reaches the previous shard one round later. Each round is
rematerialised (``jax.checkpoint``): the backward keeps the C incoming states, not C rounds' residuals.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.atlas_memory import AtlasInputs, AtlasSettings, atlas_memory, init_state
from seqmodels.layers.context import context_map, pass_along, previous_tail, shard_index
from seqmodels.sharding import sequence_shards

SEQUENCE = ("batch", "seq", "heads", None)
GATES = ("batch", "seq", "heads")
INPUT_NAMES = (SEQUENCE,) * 3 + (GATES,) * 4 + (("batch", "seq"), ("heads", None))
MEMORY = ("heads", None, None)


def split_atlas_memory(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings, *,
                       impl: str) -> tuple[jax.Array, tuple]:
    """``atlas_memory``'s ``(y [B, T, H, V], M_T)`` for rows split over ``context`` (module docstring)."""
    shards = sequence_shards()
    shard_length = inputs.segment_ids.shape[1] // shards
    if shard_length % settings.chunk_size:
        raise ValueError(f"the Atlas memory over mesh.context={shards} shards of {shard_length} tokens needs "
                         f"shards of a multiple of model.atlas.chunk_size={settings.chunk_size} tokens; make "
                         "data.seq_len / mesh.context a multiple of it")

    def local(*args):
        shard_inputs, initial = AtlasInputs(*args[:9]), args[9:]
        index, segment_ids = shard_index(), shard_inputs.segment_ids
        continues = (segment_ids[:, 0] == previous_tail(segment_ids, 1, shards)[:, 0]) & (index > 0)

        def run(state):
            y, memory, state = atlas_memory(shard_inputs, initial, settings, impl=impl, return_memory=True,
                                            initial_state=state, continues=continues, return_state=True)
            return (y, memory), state

        start = init_state(segment_ids.shape[0], initial, settings)
        shapes = jax.eval_shape(lambda state: run(state)[0], start)

        def idle(state):
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), state

        @jax.checkpoint
        def round_(state, round_index):
            outputs, state_out = jax.lax.cond(index == round_index, run, idle, state)
            passed = jax.tree.map(lambda x: pass_along(x, shards, cyclic=False), state_out)
            state = jax.tree.map(lambda new, old: jnp.where(index == round_index + 1, new, old), passed, state)
            return state, outputs

        _, outputs = jax.lax.scan(round_, start, jnp.arange(shards))  # [C, ...]: shard c's own in round c
        y, memory = jax.tree.map(lambda x: x[index], outputs)
        return y, tuple(m[:, None] for m in memory)  # [B, 1, H, m, n]: the shard's M_T along the sequence

    memory_names = tuple(("batch", "seq", "heads", None, None) for _ in initial_memory)
    y, memory = context_map(local, (*inputs, *initial_memory), INPUT_NAMES + (MEMORY,) * len(initial_memory),
                            (SEQUENCE, memory_names))
    return y, tuple(m[:, -1] for m in memory)  # the last shard's M_T is the row's
