"""Percentile-bootstrap confidence intervals over documents or examples (Efron & Tibshirani 1993, ch. 13).

For units ``i = 1..n`` with values ``x_i`` and weights ``w_i`` (tokens of a document; 1 for an
example) the statistic is the weighted mean ``sum w x / sum w``. ``resamples`` times, draw ``n`` units
with replacement (numpy's ``default_rng(seed)``) and recompute it; the ``level`` interval is the
``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those statistics. Resampling whole documents
keeps the correlation of a document's tokens inside one unit, so the interval reflects how many
documents were read, not how many tokens. A monotone transform of the statistic (perplexity =
exp(loss)) has the transformed interval.
"""

from __future__ import annotations

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000


def bootstrap_interval(values, weights=None, *, level: float = LEVEL, resamples: int = RESAMPLES,
                       seed: int = 0) -> dict:
    """``{"low", "high", "level", "resamples", "units", "method"}`` for the weighted mean of ``values``."""
    values = np.asarray(values, np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"values must be a non-empty 1-D array, got shape {values.shape}")
    weights = np.ones_like(values) if weights is None else np.asarray(weights, np.float64)
    if weights.shape != values.shape or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("weights must be non-negative, shaped like values, and not all zero")
    return ratio_interval(values * weights, weights, level=level, resamples=resamples, seed=seed)


def ratio_interval(numerators, denominators, *, level: float = LEVEL, resamples: int = RESAMPLES,
                   seed: int = 0) -> dict:
    """The interval of ``sum numerators / sum denominators`` over resampled units (a weighted mean when the
    numerators are ``w x`` and the denominators ``w``; the share of a loss gap that a model recovers when they
    are each unit's summed gap terms). Same dict as ``bootstrap_interval``."""
    numerators, denominators = np.asarray(numerators, np.float64), np.asarray(denominators, np.float64)
    if numerators.ndim != 1 or numerators.size == 0:
        raise ValueError(f"numerators must be a non-empty 1-D array, got shape {numerators.shape}")
    if denominators.shape != numerators.shape or denominators.sum() == 0:
        raise ValueError("denominators must be shaped like the numerators and not sum to zero")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not isinstance(resamples, int) or resamples < 10:
        raise ValueError(f"resamples must be an int >= 10, got {resamples!r}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, numerators.size, size=(resamples, numerators.size))
    totals = denominators[picks].sum(axis=1)
    statistics = numerators[picks].sum(axis=1) / np.where(totals != 0, totals, np.nan)
    statistics = statistics[np.isfinite(statistics)]
    low, high = np.quantile(statistics, [(1 - level) / 2, (1 + level) / 2])
    return {"low": float(low), "high": float(high), "level": level, "resamples": resamples,
            "units": int(numerators.size), "method": "percentile bootstrap"}
