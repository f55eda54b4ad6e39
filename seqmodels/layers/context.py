"""Context parallelism: the collectives that let token-mixing operations run on a row split into shards.

Under ``mesh.context = C > 1`` a row of T tokens is split into C contiguous shards of ``T / C`` tokens,
shard c on the c-th device of the ``context`` mesh axis (``seqmodels.sharding``: the logical axis
``seq``). Token-wise work (projections, MLPs, norms, the loss) is plain SPMD over the split sequence;
what mixes tokens runs per shard inside ``jax.shard_map`` (``context_map``) and exchanges what crosses a
shard boundary with two primitives:

* a **halo**, ``previous_tail(x, width)``: the last ``width`` tokens of the previous shard (zeros on
  shard 0), one ``ppermute`` of ``[B, width, ...]``: the short convolutions take ``conv_size - 1`` tokens.
* an **all-gather** of the row, ``gather_sequence(x)``: attention's keys and values.
* a **re-layout** into the load-balanced order and back, ``to_balanced(x)`` / ``from_balanced(x)``: with
  the row cut into 2C chunks of ``T / (2C)`` tokens, shard c holds chunks c and ``2C - 1 - c`` instead of
  ``2c`` and ``2c + 1``, so causal attention's work is equal on every shard. Each shard's first half holds
  an even chunk and its second half an odd one or the reverse, and the even chunks (likewise the odd
  ones) move by a permutation of the shards: two ``ppermute`` of ``[B, T / (2C), ...]`` each way.
* a **delay** of the row by ``shift`` tokens, ``delayed(x, shift, names)`` (position t holds token
  ``t - shift``, zeros before the row): a halo of ``shift`` tokens when ``shift`` is a Python int no
  longer than a shard, else (a traced shift, or a longer one) the gathered row: AHN's evicted stream.
* a **state prefix scan**, ``incoming_states(transition, final, apply)``: for a linear recurrence
  ``S_t = A_t S_{t-1} + B_t`` each shard runs its chunked pass from a zero state and returns its final
  state ``F_c`` and its transition ``A_c`` (the product of its ``A_t``), so that
  ``S_out_c = A_c S_in_c + F_c``. The affine maps ``(A_c, F_c)`` compose associatively,
  ``(A_2, F_2) o (A_1, F_1) = (A_2 A_1, A_2 F_1 + F_2)``, so a Hillis-Steele inclusive scan over the
  axis (``ppermute`` by 1, 2, 4, ... shards: ceil(log2 C) rounds, float32) gives every shard the map of
  all shards up to it, and one more shift by 1 gives shard c its incoming state ``S_in_c`` (zero on
  shard 0: training starts every row from a zero state). The backward is autodiff of the same
  program: each ``ppermute`` transposes to the reverse shift, so gradients run the chain in reverse.

A document that starts inside a shard cuts the chain there by itself: its first token's log decay is
``seqmodels.layers.segments.RESET_LOG_DECAY``, so the shard's transition carries ``exp(-30)`` and the
incoming state reaches nothing past it, exactly as on one device.

This follows flash-linear-attention's context parallelism (``fla/ops/cp``: each rank's state from zero
and its transition, chained in float32, the chain reversed in the backward) and MaxText's Gated DeltaNet
context parallelism (a ``ppermute`` prefix scan over devices); where fla all-gathers the C pairs and
chains them on every rank, the scan here moves ``ceil(log2 C)`` (state, transition) pairs and one
state per shard instead of C pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from seqmodels.sharding import SEQUENCE_AXIS, logical_spec, sequence_shards


def sequence_is_split(length: int) -> bool:
    """True when the current mesh splits a row of ``length`` tokens over ``context`` (raises if it cannot)."""
    shards = sequence_shards()
    if shards == 1:
        return False
    if length % shards:
        raise ValueError(f"a sequence of {length} tokens cannot be split into mesh.context={shards} equal shards; "
                         "make data.seq_len a multiple of mesh.context")
    return True


def context_map(fn: Callable, args: Sequence, in_names: Sequence, out_names) -> Callable:
    """``fn(*args)`` run per shard (``jax.shard_map``) with the sequence split over ``context``.

    ``in_names`` gives each argument's logical axes (None for an argument that is None; ``()`` for a
    replicated one), ``out_names`` a pytree of logical axes for the outputs, sized like the argument
    of the same names: every logical axis keeps the mesh axes ``seqmodels.sharding.RULES`` gives it, so
    ``batch`` stays data-parallel and ``heads`` tensor-parallel inside. Returns ``fn``'s outputs.
    """
    mesh = jax.sharding.get_abstract_mesh()
    sizes = {}
    for names, x in zip(in_names, args):
        if x is not None:
            sizes.update({name: size for name, size in zip(names, x.shape) if name is not None})

    def spec(names):
        return logical_spec(names, tuple(sizes.get(name, 1) for name in names), mesh)

    in_specs = tuple(jax.sharding.PartitionSpec() if x is None else spec(names) for names, x in zip(in_names, args))
    out_specs = jax.tree.map(spec, out_names, is_leaf=_is_names)
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)


def _is_names(node) -> bool:
    return isinstance(node, tuple) and all(name is None or isinstance(name, str) for name in node)


def shard_index() -> jax.Array:
    """Inside ``context_map``: this shard's index along the sequence (0 = the row's first tokens)."""
    return jax.lax.axis_index(SEQUENCE_AXIS)


def _shift_forward(x: jax.Array, shift: int, shards: int) -> jax.Array:
    """Shard c receives shard c - shift's ``x``; shards below ``shift`` receive zeros."""
    return jax.lax.ppermute(x, SEQUENCE_AXIS, [(c, c + shift) for c in range(shards - shift)])


def pass_along(x: jax.Array, shards: int, *, cyclic: bool) -> jax.Array:
    """Inside ``context_map``: shard c receives shard c - 1's ``x`` (one ``ppermute``): a ring step. With
    ``cyclic`` shard 0 receives the last shard's ``x``, else zeros."""
    if not cyclic:
        return _shift_forward(x, 1, shards)
    return jax.lax.ppermute(x, SEQUENCE_AXIS, [(c, (c + 1) % shards) for c in range(shards)])


def previous_tail(x: jax.Array, width: int, shards: int) -> jax.Array:
    """Inside ``context_map``: the previous shard's last ``width`` tokens of ``x [B, T_local, ...]``
    (zeros on shard 0): the halo of a window reaching ``width`` tokens back."""
    if not 0 < width <= x.shape[1]:
        raise ValueError(f"a halo of {width} tokens needs 1 <= width <= the {x.shape[1]} tokens of a shard; "
                         "use fewer mesh.context shards or a longer data.seq_len")
    return _shift_forward(x[:, x.shape[1] - width:], 1, shards)


def gather_sequence(x: jax.Array) -> jax.Array:
    """Inside ``context_map``: ``x [B, T_local, ...]`` of every shard, in order: the whole row ``[B, T, ...]``."""
    return jax.lax.all_gather(x, SEQUENCE_AXIS, axis=1, tiled=True)


def balanced_shard(chunk: int, shards: int) -> int:
    """The shard that holds ``chunk`` (of the row's ``2 shards`` chunks) in the load-balanced layout."""
    return chunk if chunk < shards else 2 * shards - 1 - chunk


def _check_halves(x: jax.Array) -> int:
    if x.shape[1] % 2:
        raise ValueError(f"the load-balanced layout cuts each shard into two halves; a shard of {x.shape[1]} tokens "
                         "cannot be: make data.seq_len a multiple of 2 * mesh.context, or set "
                         "model.attention.context_layout=contiguous")
    return x.shape[1] // 2


def to_balanced(x: jax.Array, shards: int) -> jax.Array:
    """Inside ``context_map``: ``x [B, T_local, ...]`` of the contiguous layout (shard c holds chunks 2c and
    2c + 1 of the row's 2C) in the load-balanced one (shard c holds chunks c and 2C - 1 - c, in that order)."""
    half = _check_halves(x)
    even = jax.lax.ppermute(x[:, :half], SEQUENCE_AXIS, [(c, balanced_shard(2 * c, shards)) for c in range(shards)])
    odd = jax.lax.ppermute(x[:, half:], SEQUENCE_AXIS, [(c, balanced_shard(2 * c + 1, shards)) for c in range(shards)])
    first_is_even = shard_index() % 2 == 0  # shard c's first chunk is chunk c
    return jnp.where(first_is_even, jnp.concatenate([even, odd], axis=1), jnp.concatenate([odd, even], axis=1))


def from_balanced(x: jax.Array, shards: int) -> jax.Array:
    """Inside ``context_map``: the inverse of ``to_balanced``."""
    half = _check_halves(x)
    first_is_even = shard_index() % 2 == 0
    even = jnp.where(first_is_even, x[:, :half], x[:, half:])
    odd = jnp.where(first_is_even, x[:, half:], x[:, :half])
    even = jax.lax.ppermute(even, SEQUENCE_AXIS, [(balanced_shard(2 * c, shards), c) for c in range(shards)])
    odd = jax.lax.ppermute(odd, SEQUENCE_AXIS, [(balanced_shard(2 * c + 1, shards), c) for c in range(shards)])
    return jnp.concatenate([even, odd], axis=1)


def delayed(x: jax.Array, shift, names: tuple) -> jax.Array:
    """``x [B, T, ...]`` (logical axes ``names``, the sequence split over ``context``) delayed by ``shift`` tokens:
    position t holds ``x_{t - shift}``, zeros for ``t < shift``. A Python-int ``shift`` up to a shard's length
    moves one halo (``previous_tail``, ``[B, shift, ...]`` per shard); a traced or longer shift gathers the row
    (``gather_sequence``, ``(C - 1) / C`` of ``[B, T, ...]`` arriving at each shard)."""
    shards = sequence_shards()
    static = isinstance(shift, int)

    def local(x, shift_value):
        length = x.shape[1]
        if static and shift == 0:
            return x
        if static and shift <= length:
            return jnp.concatenate([previous_tail(x, shift, shards), x[:, :length - shift]], axis=1)
        row = gather_sequence(x)
        source = shard_index() * length + jnp.arange(length) - shift_value
        taken = jnp.take(row, jnp.clip(source, 0, row.shape[1] - 1), axis=1)
        return jnp.where((source >= 0).reshape((1, length) + (1,) * (x.ndim - 2)), taken, jnp.zeros_like(taken))

    return context_map(local, (x, jnp.asarray(shift, jnp.int32)), (names, ()), names)


def diagonal_apply(transition: jax.Array, x: jax.Array) -> jax.Array:
    """A diagonal transition ``[B, H, K, 1]`` (or ``[B, H, 1, 1]``) applied to a state or another transition."""
    return transition * x


def matrix_apply(transition: jax.Array, x: jax.Array) -> jax.Array:
    """A ``[B, H, K, K]`` transition applied (on the left) to a ``[B, H, K, V]`` state or another transition."""
    return jnp.einsum("bhij,bhjv->bhiv", transition, x, preferred_element_type=jnp.float32)


def incoming_states(transition: jax.Array, final: jax.Array, shards: int,
                    apply: Callable[[jax.Array, jax.Array], jax.Array]) -> jax.Array:
    """Inside ``context_map``: each shard's incoming state from the shards' ``(transition, final)`` maps.

    ``final`` is the shard's final state from a zero start, ``transition`` the map ``apply(transition, S)``
    of the state entering the shard to its share of the state leaving it. Float32 throughout; shard 0
    receives zeros (module docstring).
    """
    transition, final = transition.astype(jnp.float32), final.astype(jnp.float32)
    index, shift = shard_index(), 1
    while shift < shards:  # inclusive Hillis-Steele scan: after it, (transition, final) map S_0 to S_out_c
        earlier_transition = _shift_forward(transition, shift, shards)
        earlier_final = _shift_forward(final, shift, shards)
        has_earlier = index >= shift
        final = jnp.where(has_earlier, apply(transition, earlier_final) + final, final)
        transition = jnp.where(has_earlier, apply(transition, earlier_transition), transition)
        shift *= 2
    return _shift_forward(final, 1, shards)
