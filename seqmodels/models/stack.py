"""Scanned layers (``model.scan_layers``): repeated groups of blocks as one ``lax.scan`` over stacked parameters.

``model.mixers`` is usually a group repeated R times (``[gated_deltanet, gated_deltanet, attention] * 8``:
a group of 3, R = 8). Unrolled, XLA compiles R copies of the group, so compile time and program
size grow with depth. Scanned, the R groups' parameters are stacked on a leading ``layers`` axis
(replicated by the sharding rules) and the forward is

    x = scan(lambda x, params_r: Group(params_r)(x), x, stacked_params)

one compiled group body, whatever R. With ``model.remat`` the body is rematerialised, so the
backward keeps one ``[B, T, d_model]`` input per group. Decoding scans the same way, carrying each
group's cache (stacked like the parameters).

The stacked parameters are the unrolled model's, group by group: group r holds blocks
``r * P .. r * P + P - 1`` (P the group length), initialised from the same random stream in the
same order, so a scanned and an unrolled model from one seed hold the same numbers
(``unstack_blocks`` maps the one layout onto the other, for consumers that need layers).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from seqmodels.config import ConfigError

LAYERS_AXIS = "layers"


def repeat_period(mixers) -> int:
    """The length P of the shortest group whose repetition is ``mixers`` (``len(mixers)`` if none repeats)."""
    mixers = list(mixers)
    for period in range(1, len(mixers) + 1):
        if len(mixers) % period == 0 and mixers == mixers[:period] * (len(mixers) // period):
            return period
    raise ConfigError("model.mixers: needs at least one layer")


class Group(nnx.Module):
    """Consecutive blocks applied in order (one group of the repetition)."""

    def __init__(self, blocks: list):
        self.blocks = nnx.List(blocks)

    def __call__(self, x, *, segment_ids=None, positions=None, caches=None):
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, cache = block(x, segment_ids=segment_ids, positions=positions,
                             cache=None if caches is None else caches[i])
            new_caches.append(cache)
        return x, (None if caches is None else new_caches)


def _with_layers_axis(variable):
    axes = variable.get_metadata().get("logical_axes")
    variable.set_metadata(logical_axes=(LAYERS_AXIS, *axes))
    return variable


def stack_groups(groups: list[Group]) -> Group:
    """One ``Group`` whose parameters are those of ``groups`` stacked on a leading ``layers`` axis."""
    graphdef = nnx.split(groups[0])[0]
    states = [nnx.split(group)[1] for group in groups]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
    for _, variable in nnx.to_flat_state(stacked):
        _with_layers_axis(variable)
    return nnx.merge(graphdef, stacked)


def scan_group(group: Group, x, *, segment_ids, positions, caches=None, remat_policy=None, remat: bool = False):
    """``(x, (caches, sown))``: ``x`` through every stacked group in order, the stacked caches (when
    decoding) and what the group's modules sowed (``nnx.Intermediate``, captured per group and
    stacked on a leading axis, as a pure dict; ``{}`` when nothing was sown)."""
    graphdef, state = nnx.split(group)

    def body(x, slices):
        group_state, group_caches = slices
        run = nnx.capture(nnx.merge(graphdef, group_state), nnx.Intermediate)
        (x, new_caches), sown = run(x, segment_ids=segment_ids, positions=positions, caches=group_caches)
        return x, (new_caches, nnx.to_pure_dict(sown))

    if remat:
        body = jax.checkpoint(body, policy=remat_policy)
    return jax.lax.scan(body, x, (state, caches))


def unstack_sown(sown: dict, repeats: int, period: int) -> dict:
    """``scan_group``'s stacked ``sown`` (``{"blocks": {i: ...}}``, leading axis R) in the unrolled layout
    ``{"blocks": {r * period + i: ...}}``, every group's slice its own block."""
    grouped = sown.get("blocks", {})
    blocks = {r * period + i: jax.tree.map(lambda x, r=r: x[r], grouped[i]) for r in range(repeats) for i in grouped}
    return {"blocks": blocks} if blocks else {}


def slice_group(group: Group, index: int) -> Group:
    """Group ``index`` of the stack as a module of its own (unstacked parameters)."""
    graphdef, state = nnx.split(group)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x[index], state))


def unstack_blocks(params: dict, repeats: int) -> dict:
    """Parameters of a scanned LM (``{"stack": {"blocks": {i: ...}}, ...}``) in the unrolled layout
    (``{"blocks": {r * P + i: ...}, ...}``), every ``layers`` slice its own block."""
    if "stack" not in params:
        raise ValueError("unstack_blocks: these parameters have no 'stack' entry (not a scanned model)")
    grouped = params["stack"]["blocks"]
    period = len(grouped)
    blocks = {r * period + i: jax.tree.map(lambda x, r=r: x[r], grouped[i]) for r in range(repeats)
              for i in range(period)}
    return {**{k: v for k, v in params.items() if k != "stack"}, "blocks": blocks}
