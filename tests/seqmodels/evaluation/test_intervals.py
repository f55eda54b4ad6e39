"""Percentile-bootstrap intervals: they cover a known mean as often as their level says."""

import numpy as np
import pytest

from seqmodels.evaluation.intervals import bootstrap_interval, ratio_interval


def coverage(level, trials=100, units=200, weighted=False):
    """How many of ``trials`` seeded samples give an interval containing the true mean (0.3)."""
    covered = 0
    for trial in range(trials):
        rng = np.random.default_rng(1000 + trial)
        if weighted:  # documents of random length whose token losses average 0.3 in expectation
            weights = rng.integers(1, 50, size=units).astype(float)
            values = rng.normal(0.3, 1.0 / np.sqrt(weights))
        else:  # examples right with probability 0.3
            weights, values = None, (rng.random(units) < 0.3).astype(float)
        interval = bootstrap_interval(values, weights, level=level, resamples=1000, seed=trial)
        covered += interval["low"] <= 0.3 <= interval["high"]
    return covered


@pytest.mark.parametrize("weighted", [False, True])
def test_a_95_percent_interval_covers_the_true_mean_in_at_least_90_of_100_trials(weighted):
    assert coverage(0.95, weighted=weighted) >= 90


def test_a_50_percent_interval_covers_it_about_half_the_time():
    # A loose check that the level matters: an always-wide interval would cover 100 of 100.
    assert 30 <= coverage(0.5) <= 70


def test_the_interval_is_seeded_and_brackets_the_weighted_mean():
    values, weights = np.array([1.0, 2.0, 4.0, 3.0]), np.array([1.0, 3.0, 1.0, 2.0])
    first = bootstrap_interval(values, weights, seed=3)
    assert first == bootstrap_interval(values, weights, seed=3)
    mean = (values * weights).sum() / weights.sum()
    assert first["low"] <= mean <= first["high"] and first["low"] < first["high"]
    assert first["level"] == 0.95 and first["method"] == "percentile bootstrap" and first["units"] == 4


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="non-empty 1-D"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match="weights must be non-negative"):
        bootstrap_interval([1.0, 2.0], [1.0, -1.0])
    with pytest.raises(ValueError, match="level must be in"):
        bootstrap_interval([1.0, 2.0], level=1.5)


def test_a_ratio_interval_covers_the_true_share_of_a_gap_in_at_least_90_of_100_trials():
    """Rows of random length, a per-token gap of 0.5 of which a model recovers 0.4 in expectation (noisy per
    row): the interval of sum(recovered) / sum(gap) over resampled rows covers 0.4."""
    covered = 0
    for trial in range(100):
        rng = np.random.default_rng(2000 + trial)
        tokens = rng.integers(100, 2000, size=40).astype(float)
        gap = tokens * rng.normal(0.5, 0.2, size=40)
        recovered = 0.4 * gap + tokens * rng.normal(0.0, 0.1, size=40)
        interval = ratio_interval(recovered, gap, resamples=1000, seed=trial)
        covered += interval["low"] <= 0.4 <= interval["high"]
    assert covered >= 90


def test_a_ratio_interval_refuses_mismatched_or_zero_denominators():
    with pytest.raises(ValueError, match="shaped like the numerators"):
        ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="not sum to zero"):
        ratio_interval([1.0, 2.0], [1.0, -1.0])
