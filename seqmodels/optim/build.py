"""The optimizer named by ``optim.name``, with gradient clipping and the learning-rate schedule.

``adamw``: AdamW with decoupled weight decay on matrices (not norms, biases, the embedding).

``muon``: Muon (``seqmodels.optim.muon``) on every projection to or from the residual stream
(a parameter of rank >= 2 with an ``embed`` logical axis and no ``vocab`` axis), AdamW on the
rest (embedding, output head, norms, biases, convolution and decay parameters). A projection
kernel of shape ``[embed, heads, head_dim]`` is orthogonalised as the matrix
``[embed, heads * head_dim]`` (and ``[heads, head_dim, embed]`` as ``[heads * head_dim, embed]``);
with ``optim.muon_per_head`` each head's block is orthogonalised on its own.
"""

from __future__ import annotations

import math

import jax
import optax

from seqmodels.config import OptimConfig
from seqmodels.optim.muon import muon, path_name
from seqmodels.optim.schedules import learning_rate_schedule

HEAD_AXES = ("heads", "kv_heads")


def decay_mask(params):
    """Weight decay applies to matrices only: not to norms, biases, or the embedding table."""
    def decays(path, leaf):
        name = str(getattr(path[-1], "key", path[-1]))
        return leaf.ndim >= 2 and name not in ("embed", "bias")
    return jax.tree_util.tree_map_with_path(decays, params)


def _stack_depth(axes: tuple) -> int:
    """Leading ``layers`` axes (scanned layers): a stack of matrices, each orthogonalised on its own."""
    depth = 0
    while depth < len(axes) and axes[depth] == "layers":
        depth += 1
    return depth


def _uses_muon(axes: tuple) -> bool:
    axes = axes[_stack_depth(axes):]
    return len(axes) >= 2 and "embed" in axes and "vocab" not in axes


def _matrix_shape(axes: tuple, shape: tuple) -> tuple[int, ...]:
    """The 2-D view Muon orthogonalises: the ``embed`` axis on one side, everything else on the other
    (behind the leading ``layers`` axes of a scanned stack)."""
    depth = _stack_depth(axes)
    stack, axes, shape = tuple(shape[:depth]), axes[depth:], shape[depth:]
    if axes[-1] == "embed":
        return (*stack, math.prod(shape[:-1]), shape[-1])
    return (*stack, shape[0], math.prod(shape[1:]))


def _head_split(axes: tuple, shape: tuple):
    """``(axis, heads)`` of the 2-D view for ``muon(per_head=...)``, or None without a heads axis."""
    for name in HEAD_AXES:
        if name in axes:
            heads = shape[axes.index(name)]
            return (-2, heads) if axes[-1] == "embed" else (-1, heads)
    return None


def as_matrices(inner: optax.GradientTransformation, shapes: dict) -> optax.GradientTransformation:
    """Run ``inner`` on 2-D views of the parameters listed in ``shapes`` (a pytree of shapes or None)."""
    def to_2d(tree):
        return jax.tree.map(lambda x, s: x if s is None else x.reshape(s), tree, shapes,
                            is_leaf=lambda s: s is None)

    def back(tree, like):
        return jax.tree.map(lambda x, ref: x.reshape(ref.shape), tree, like)

    def init(params):
        return inner.init(to_2d(params))

    def update(updates, state, params=None):
        new_updates, state = inner.update(to_2d(updates), state, None if params is None else to_2d(params))
        return back(new_updates, updates), state

    return optax.GradientTransformation(init, update)


def _muon(config: OptimConfig, schedule, param_axes, param_shapes):
    if param_axes is None or param_shapes is None:
        raise ValueError("optim.name=muon needs the parameters' logical axes and shapes")
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    flat_axes = jax.tree_util.tree_flatten_with_path(param_axes, is_leaf=is_axes)[0]
    flat_shapes = jax.tree.leaves(param_shapes, is_leaf=is_axes)
    views, use_muon, heads = {}, {}, {}
    for (path, axes), shape in zip(flat_axes, flat_shapes):
        name = path_name(path)
        use_muon[name] = _uses_muon(axes)
        views[name] = _matrix_shape(axes, shape) if use_muon[name] else None
        heads[name] = _head_split(axes, shape) if use_muon[name] and config.muon_per_head else None
    treedef = jax.tree.structure(param_axes, is_leaf=is_axes)
    names = [path_name(path) for path, _ in flat_axes]
    mask = jax.tree.unflatten(treedef, [use_muon[n] for n in names])
    adam_lr = config.muon_adam_learning_rate
    adam_schedule = schedule if not adam_lr else (lambda step: schedule(step) * adam_lr / config.learning_rate)
    inner = muon(schedule, momentum=config.muon_momentum, ns_steps=config.muon_ns_steps,
                 weight_decay=config.weight_decay, adam_learning_rate=adam_schedule, adam_b1=config.b1,
                 adam_b2=config.b2, adam_eps=config.eps, muon_mask=mask, ns_impl=config.muon_impl,
                 per_head=(lambda path, p: heads.get(path)) if config.muon_per_head else None)
    return as_matrices(inner, jax.tree.unflatten(treedef, [views[n] for n in names]))


def build_optimizer(config: OptimConfig, total_steps: int, *, param_axes=None, param_shapes=None):
    """``(optax transformation, schedule)``; clipping by global norm comes first.

    ``param_axes`` / ``param_shapes``: pure dicts of each parameter's logical axes and shape (needed by muon).
    """
    schedule = learning_rate_schedule(config, total_steps)
    if config.name == "adamw":
        core = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                           weight_decay=config.weight_decay, mask=decay_mask)
    elif config.name == "muon":
        core = _muon(config, schedule, param_axes, param_shapes)
    else:
        raise ValueError(f"optim.name={config.name!r} has no builder")
    clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip > 0 else optax.identity()
    return optax.chain(clip, core), schedule
