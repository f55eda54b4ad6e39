"""Learning-rate schedules: linear warm-up to the peak, then cosine, linear or constant."""

from __future__ import annotations

import optax

from seqmodels.config import OptimConfig


def learning_rate_schedule(config: OptimConfig, total_steps: int) -> optax.Schedule:
    """``lr(step)``: 0 -> peak over ``warmup_steps``, then down to ``peak * min_lr_ratio`` at ``total_steps``."""
    peak, floor = config.learning_rate, config.learning_rate * config.min_lr_ratio
    warmup = min(config.warmup_steps, max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup, 1)
    if config.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif config.schedule == "linear":
        after = optax.linear_schedule(peak, floor, decay_steps)
    else:
        after = optax.cosine_decay_schedule(peak, decay_steps, alpha=config.min_lr_ratio)
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])
