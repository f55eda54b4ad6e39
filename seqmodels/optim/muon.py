"""Muon: momentum orthogonalised by Newton–Schulz for weight matrices, AdamW for the rest.

For a weight matrix W [m, n] (or a stack [..., m, n] of them) with gradient G, at step t:

    M_t = beta M_{t-1} + (1 - beta) G_t                          momentum (an EMA of gradients)
    D_t = (1 - beta) G_t + beta M_t  (nesterov)   or   M_t
    O_t = NS(D_t)                                                 ~ U V^T of D_t = U S V^T
    W_t = W_{t-1} - lr_t (0.2 sqrt(max(m, n)) O_t + weight_decay W_{t-1})

NS is ``pallas_kernels.newton_schulz`` (``ns_steps`` steps, ``ns_coefficients``), run on
``ns_dtype`` operands (bf16 by default: matmuls in bf16 with fp32 accumulation).

Learning-rate scale 0.2 sqrt(max(m, n)) (Liu et al. 2025, "Muon is Scalable for LLM Training"):
an m x n semi-orthogonal matrix has RMS 1/sqrt(max(m, n)), so the scaled update has RMS 0.2, the
typical RMS of an AdamW update. Both parameter groups then move at the same rate per unit of
learning rate, which is why the AdamW group shares ``learning_rate`` (and ``weight_decay``) unless
``adam_learning_rate`` (``adam_weight_decay``) say otherwise.

Which parameters get Muon (``muon_mask``): by default ``default_muon_mask``: rank >= 2 and no
path component naming an embedding, a norm, a bias or an output head (see ``ADAMW_NAME_PATTERN``).
Leading axes of a rank > 2 parameter are a stack (e.g. scanned layers): each [m, n] matrix is
orthogonalised on its own. The rest, 1-D parameters included, get ``optax.adamw``.

Per-head orthogonalisation (``per_head``): a callable ``(path, param) -> (axis, num_heads) | None``.
``(-1, H)`` says the last axis concatenates H heads (a q/k/v projection [d_model, H * head_dim]):
each [m, n / H] block is orthogonalised on its own; ``(-2, H)`` says the same of the second-last
axis (an output projection [H * head_dim, d_model]). The learning-rate scale then uses the per-head
shape. Example: ``per_head=lambda path, p: (-1, 8) if path.endswith(("q/kernel", "k/kernel")) else None``.

Paths are the parameter's keys joined with "/" (``"layers/0/attn/q/kernel"``); a trailing ``value``
attribute (the payload of a flax ``nnx.Variable`` in an ``nnx.State``) is dropped.

Batching: the matrices (stack entries, heads) of one shape from all Muon parameters are
orthogonalised in one batched Newton–Schulz call: one kernel launch per shape.

Sharding: each matrix is orthogonalised whole. When a mesh is set (``jax.set_mesh``), every
direction D is gathered to replicated, each batch of same-shape matrices is padded with zero
matrices to a multiple of the number of devices and spread over all devices, each device runs
Newton–Schulz on its own matrices (``partition_spec`` of ``newton_schulz``: shard-local, so the
Pallas kernel runs on GPU too), and the result is gathered back; the update then takes the
parameter's sharding in the elementwise steps that follow. Resharding uses ``jax.sharding.reshard`` on a mesh of Explicit
axes and ``with_sharding_constraint`` otherwise. Without a mesh set, sharded arrays still work on
the XLA path (XLA partitions its matmuls), but a Pallas kernel cannot be partitioned: set the mesh.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, PartitionSpec

from pallas_kernels import newton_schulz
from pallas_kernels.newton_schulz.coefficients import resolve_coefficients

ADAMW_NAME_PATTERN = re.compile(r"embed|norm|bias|^(lm_|output_)?head$|^output$|^readout$", re.IGNORECASE)
UPDATE_RMS = 0.2

PathPredicate = Callable[[str, jax.Array], bool]
HeadSplit = Callable[[str, jax.Array], "tuple[int, int] | None"]


def path_name(path) -> str:
    """A pytree key path as "a/b/0/c", without the trailing ``value`` of an nnx.Variable."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    if parts and parts[-1] == "value" and isinstance(path[-1], jax.tree_util.GetAttrKey):
        parts.pop()
    return "/".join(parts)


def default_muon_mask(path: str, param) -> bool:
    """Muon for rank >= 2 parameters whose path names no embedding, norm, bias or output head."""
    return param.ndim >= 2 and not any(ADAMW_NAME_PATTERN.search(part) for part in path.split("/"))


class MuonState(NamedTuple):
    momentum: Any


def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    ns_coefficients="muon",
    ns_dtype=jnp.bfloat16,
    ns_impl: str = "auto",
    weight_decay: float = 0.0,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    adam_b1: float = 0.9,
    adam_b2: float = 0.95,
    adam_eps: float = 1e-8,
    adam_weight_decay: float | None = None,
    muon_mask: PathPredicate | Any | None = None,
    per_head: HeadSplit | None = None,
) -> optax.GradientTransformation:
    """Muon on the parameters ``muon_mask`` selects, AdamW on the rest (see the module docstring).

    ``muon_mask``: None (``default_muon_mask``), a callable ``(path, param) -> bool``, or a pytree
    of bools shaped like the parameters. ``learning_rate`` and ``adam_learning_rate`` may be
    schedules (step -> value).
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if weight_decay < 0 or (adam_weight_decay is not None and adam_weight_decay < 0):
        raise ValueError(f"weight decays must be >= 0, got {weight_decay!r} and {adam_weight_decay!r}")
    resolve_coefficients(ns_coefficients, ns_steps)
    if per_head is not None and not callable(per_head):
        raise ValueError(f"per_head must be None or a callable (path, param) -> (axis, heads): {per_head!r}")
    muon_part = optax.chain(
        scale_by_muon(momentum, nesterov, ns_steps, ns_coefficients, ns_dtype, ns_impl, per_head),
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )
    adam_part = optax.adamw(
        learning_rate if adam_learning_rate is None else adam_learning_rate,
        b1=adam_b1,
        b2=adam_b2,
        eps=adam_eps,
        weight_decay=weight_decay if adam_weight_decay is None else adam_weight_decay,
    )
    return optax.partition({"muon": muon_part, "adamw": adam_part}, lambda params: _labels(params, muon_mask))


def _labels(params, muon_mask):
    """"muon" or "adamw" per leaf; rejects Muon on a parameter of rank < 2."""
    if muon_mask is None or callable(muon_mask):
        predicate = default_muon_mask if muon_mask is None else muon_mask
        chosen = jax.tree_util.tree_map_with_path(lambda path, p: bool(predicate(path_name(path), p)), params)
    else:
        chosen = muon_mask

    def label(path, param, use_muon):
        if use_muon and param.ndim < 2:
            name = path_name(path)
            raise ValueError(f"muon_mask selects {name!r} of shape {param.shape}; Muon needs rank >= 2")
        return "muon" if use_muon else "adamw"

    return jax.tree_util.tree_map_with_path(label, params, chosen)


def scale_by_muon(
    momentum, nesterov, ns_steps, ns_coefficients, ns_dtype, ns_impl, per_head
) -> optax.GradientTransformation:
    """Momentum, Newton–Schulz and the 0.2 sqrt(max(m, n)) scale (no learning rate, no decay)."""

    def init(params):
        return MuonState(momentum=jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        new_momentum = jax.tree.map(lambda m, g: momentum * m + (1 - momentum) * g, state.momentum, updates)
        if nesterov:
            directions = jax.tree.map(lambda m, g: momentum * m + (1 - momentum) * g, new_momentum, updates)
        else:
            directions = new_momentum

        def orthogonalize_stack(stack, spec=None):
            options = dict(steps=ns_steps, coefficients=ns_coefficients, impl=ns_impl, partition_spec=spec)
            return newton_schulz(stack.astype(ns_dtype), **options).astype(jnp.float32)

        leaves, treedef = jax.tree_util.tree_flatten_with_path(directions)
        named = [(path_name(path), leaf) for path, leaf in leaves]
        ortho = _orthogonalize_leaves(named, per_head, orthogonalize_stack)
        return jax.tree_util.tree_unflatten(treedef, ortho), MuonState(new_momentum)

    return optax.GradientTransformation(init, update)


def _orthogonalize_leaves(named_leaves, per_head, orthogonalize_stack) -> list:
    """UPDATE_RMS sqrt(max(m, n)) NS(matrix) for every matrix (and head) of every leaf.

    Matrices of one shape, from all leaves, go through one batched call: one kernel launch, and
    under a mesh a stack long enough to keep every device busy.
    """
    stacks, restores, groups = [], [], {}
    for index, (name, direction) in enumerate(named_leaves):
        heads = None if per_head is None else per_head(name, direction)
        stack, restore = _matrix_stack(_replicated(direction), heads, name)
        stacks.append(stack)
        restores.append(restore)
        groups.setdefault(stack.shape[-2:], []).append(index)
    results = [None] * len(stacks)
    for (rows, cols), indices in groups.items():
        joined = jnp.concatenate([stacks[i] for i in indices]) if len(indices) > 1 else stacks[indices[0]]
        ortho = UPDATE_RMS * math.sqrt(max(rows, cols)) * _shard_local_stack(joined, orthogonalize_stack)
        offsets = list(itertools.accumulate(stacks[i].shape[0] for i in indices))[:-1]
        for i, part in zip(indices, jnp.split(ortho, offsets)):
            results[i] = restores[i](part).astype(named_leaves[i][1].dtype)
    return results


def _matrix_stack(direction, heads, name):
    """direction [..., m, n] -> ([S, m', n'] matrices to orthogonalise, inverse map)."""
    shape = direction.shape
    if heads is None:
        return direction.reshape((-1,) + shape[-2:]), lambda x: x.reshape(shape)
    axis, num_heads = heads
    if axis not in (-1, -2) or not isinstance(num_heads, int) or num_heads < 1 or shape[axis] % num_heads:
        raise ValueError(
            f"per_head({name!r}) must give (axis in (-1, -2), num_heads dividing that axis) "
            f"for shape {shape}, got {heads!r}"
        )
    lead, (rows, cols) = shape[:-2], shape[-2:]
    if axis == -2:
        return direction.reshape((-1, rows // num_heads, cols)), lambda x: x.reshape(shape)
    split = direction.reshape(lead + (rows, num_heads, cols // num_heads))
    stack = jnp.moveaxis(split, -2, -3).reshape((-1, rows, cols // num_heads))

    def restore(x):
        return jnp.moveaxis(x.reshape(lead + (num_heads, rows, cols // num_heads)), -3, -2).reshape(shape)

    return stack, restore


def _active_mesh():
    """The mesh set by ``jax.set_mesh`` if it has more than one device, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or mesh.size == 1 else mesh


def _constrain(x, spec: PartitionSpec, mesh):
    """Reshard ``x`` to ``spec``: ``reshard`` on Explicit axes, a sharding constraint on Auto axes."""
    if all(axis_type == AxisType.Explicit for axis_type in mesh.axis_types):
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, spec)


def _replicated(x):
    """``x`` gathered whole onto every device when a mesh is set (reshapes then stay local)."""
    mesh = _active_mesh()
    return x if mesh is None else _constrain(x, PartitionSpec(), mesh)


def _shard_local_stack(stack, orthogonalize_stack):
    """NS of a replicated stack [S, m, n], its matrices spread over all devices of the mesh."""
    mesh = _active_mesh()
    if mesh is None:
        return orthogonalize_stack(stack)
    count, spread = stack.shape[0], PartitionSpec(tuple(mesh.axis_names))
    padded = _constrain(jnp.pad(stack, ((0, -count % mesh.size), (0, 0), (0, 0))), spread, mesh)
    ortho = orthogonalize_stack(padded, spread)
    return _constrain(ortho, PartitionSpec(), mesh)[:count]
