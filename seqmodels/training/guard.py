"""A collapse guard: stop a run whose finite loss has gone bad before its state replaces good checkpoints.

A step is *anomalous* when its gradient norm is exactly zero (the update no longer depends on the
data: a collapsed model, e.g. saturated logits after a huge learning rate) or when its loss spikes,

    loss_t - mean_t > sigma * max(std_t, 0.01 * mean_t),

where ``mean_t`` and ``std_t`` are exponential moving averages (decay 0.98, about the last 50 steps)
of the loss over the healthy steps before ``t``; the spike test starts once ``WARMUP`` healthy steps
are seen (early losses fall too fast for statistics). The 1 % floor keeps a flat, noiseless plateau
from turning every small bump into a spike. Anomalous steps do not enter the statistics. While the
latest step is anomalous the loop defers checkpoints; after ``steps`` anomalous steps in a row it stops.
"""

from __future__ import annotations

import math

WARMUP = 10
DECAY = 0.98


class CollapseGuard:
    def __init__(self, steps: int, sigma: float):
        if steps < 0 or sigma <= 0:
            raise ValueError(f"CollapseGuard: need steps >= 0 and sigma > 0, got steps={steps}, sigma={sigma}")
        self.steps, self.sigma = steps, sigma
        self.mean, self.var, self.seen = 0.0, 0.0, 0
        self.streak: list[str] = []  # what was anomalous about each step of the current run of bad steps

    @property
    def suspicious(self) -> bool:
        """The latest step was anomalous: its state should not be saved."""
        return self.steps > 0 and bool(self.streak)

    @property
    def tripped(self) -> bool:
        return self.steps > 0 and len(self.streak) >= self.steps

    def anomaly(self, loss: float, grad_norm: float) -> str | None:
        """What is wrong with a step of this loss and gradient norm (None when healthy); no update."""
        if grad_norm == 0.0:
            return f"gradient norm 0 (loss {loss:.4f})"
        if self.seen >= WARMUP:
            std = math.sqrt(max(self.var, 0.0))
            if loss - self.mean > self.sigma * max(std, 0.01 * abs(self.mean)):
                return f"loss {loss:.4f} is {(loss - self.mean) / max(std, 1e-12):.1f} std above its running mean " \
                       f"{self.mean:.4f}"
        return None

    def observe(self, step: int, loss: float, grad_norm: float) -> None:
        """Update the streak of anomalous steps and, for a healthy step, the running statistics."""
        if self.steps == 0:
            return
        problem = self.anomaly(loss, grad_norm)
        if problem is not None:
            self.streak.append(f"step {step}: {problem}")
            return
        self.streak = []
        if self.seen == 0:
            self.mean, self.var = loss, 0.0
        else:
            delta = loss - self.mean
            self.mean += (1 - DECAY) * delta
            self.var = DECAY * (self.var + (1 - DECAY) * delta * delta)
        self.seen += 1
