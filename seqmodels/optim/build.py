"""The optimizer named by ``optim.name``, with gradient clipping and the learning-rate schedule."""

from __future__ import annotations

import jax
import optax

from seqmodels.config import OptimConfig
from seqmodels.optim.schedules import learning_rate_schedule


def decay_mask(params):
    """Weight decay applies to matrices only: not to norms, biases, or the embedding table."""
    def decays(path, leaf):
        name = str(getattr(path[-1], "key", path[-1]))
        return leaf.ndim >= 2 and name != "embed"
    return jax.tree_util.tree_map_with_path(decays, params)


def build_optimizer(config: OptimConfig, total_steps: int):
    """``(optax transformation, schedule)`` for ``config``; clipping by global norm comes first."""
    schedule = learning_rate_schedule(config, total_steps)
    if config.name == "adamw":
        core = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                           weight_decay=config.weight_decay, mask=decay_mask)
    else:
        raise ValueError(f"optim.name={config.name!r} has no builder")
    clip = optax.clip_by_global_norm(config.grad_clip) if config.grad_clip > 0 else optax.identity()
    return optax.chain(clip, core), schedule
