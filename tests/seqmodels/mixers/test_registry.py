"""The mixer registry: every registered mixer builds from a config and offers the Mixer interface."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.mixers import MIXERS, Mixer, build_mixer, check_mixer_names, mixer_flops_per_token


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_registered_mixer_offers_the_mixer_interface(name):
    config = ModelConfig(d_model=32, num_heads=2, max_seq_len=32, kernel_impl="xla")
    mixer = build_mixer(name, config, nnx.Rngs(params=0))
    assert isinstance(mixer, Mixer)
    x = jax.random.normal(jax.random.key(0), (2, 8, 32))
    y, cache = jax.eval_shape(lambda: mixer(x, segment_ids=jnp.ones((2, 8), jnp.int32)))
    assert y.shape == x.shape and cache is None
    assert mixer_flops_per_token(name, config, 8) > 0


def test_an_object_without_init_cache_is_not_a_mixer():
    class Half:
        def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
            return x, cache

    assert not isinstance(Half(), Mixer)


def test_unknown_mixers_are_named_with_the_key_and_the_known_ones():
    with pytest.raises(ConfigError, match="model.mixers: unknown mixer 'rnn'; known mixers: .*attention"):
        check_mixer_names(["attention", "rnn"])
    with pytest.raises(ConfigError, match="model.looped.mixer: unknown mixer 'rnn'"):
        check_mixer_names(["rnn"], key="model.looped.mixer")
