"""Rotary embedding and the sinusoidal position features of the same frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqmodels.layers.rotary import apply_rotary, sinusoidal_positions


def test_rotary_scores_depend_on_the_offset_only():
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 8))
    def score(i, j):
        qi = apply_rotary(q, jnp.array([[i]]), 10000.0)
        kj = apply_rotary(k, jnp.array([[j]]), 10000.0)
        return float(jnp.sum(qi * kj))
    assert score(7, 3) == pytest.approx(score(14, 10), rel=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-3)


def test_sinusoidal_features_are_sines_then_cosines_of_the_rotary_angles():
    features = np.asarray(sinusoidal_positions(jnp.arange(5)[None], 8, 100.0))
    assert features.shape == (1, 5, 8)
    inv_freq = 100.0 ** (-np.arange(4) / 4)
    angles = np.arange(5)[:, None] * inv_freq
    np.testing.assert_allclose(features[0], np.concatenate([np.sin(angles), np.cos(angles)], 1), atol=1e-6)


def test_sinusoidal_inner_products_depend_on_the_offset_and_peak_at_zero():
    features = np.asarray(sinusoidal_positions(jnp.arange(40), 32, 10000.0))
    gram = features @ features.T  # sum_i cos((p - q) w_i)
    np.testing.assert_allclose(gram[5, 9], gram[20, 24], rtol=1e-5)
    assert np.all(np.argmax(gram, axis=1) == np.arange(40))


@pytest.mark.parametrize("dim", [0, 7])
def test_sinusoidal_positions_need_a_positive_even_dimension(dim):
    with pytest.raises(ValueError, match="positive even dimension"):
        sinusoidal_positions(jnp.arange(3), dim, 10000.0)
