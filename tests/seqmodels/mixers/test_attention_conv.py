"""Attention with the short convolution over q, k, v (``model.attention.conv_kernel``): decoding from
a cache equals the training form, documents stay isolated, and a negative width is rejected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.config_io import load_config
from seqmodels.mixers import build_mixer, mixer_flops_per_token
from seqmodels.mixers.attention import AttentionConfig, SlidingWindowConfig

# float32: the same products summed in another order (full row vs cache + one token); outputs ~0.1-1.
FP32_TOL = 1e-5


@nnx.jit
def call(mixer, x, segment_ids=None, positions=None, cache=None):
    return mixer(x, segment_ids=segment_ids, positions=positions, cache=cache)


def mixer_and_inputs(name):
    config = ModelConfig(d_model=32, num_heads=2, max_seq_len=32, init_std=0.2,
                         attention=AttentionConfig(conv_kernel=3), swa=SlidingWindowConfig(window=4))
    return build_mixer(name, config, nnx.Rngs(params=0)), jax.random.normal(jax.random.key(1), (2, 11, 32)), config


@pytest.mark.slow
@pytest.mark.parametrize("name", ["attention", "swa"])
def test_prefill_then_one_token_steps_equal_the_training_form(name):
    mixer, x, _ = mixer_and_inputs(name)
    full, _ = call(mixer, x)
    cache = mixer.init_cache(2, 11, jnp.float32)
    outputs, positions = [], jnp.arange(11)[None].repeat(2, 0)
    for start, stop in [(0, 4)] + [(t, t + 1) for t in range(4, 11)]:
        out, cache = call(mixer, x[:, start:stop], positions=positions[:, start:stop], cache=cache)
        outputs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), full, atol=FP32_TOL, rtol=FP32_TOL)


def test_the_convolution_does_not_cross_documents_and_adds_its_flops():
    mixer, x, config = mixer_and_inputs("attention")
    segment_ids = jnp.array([[1] * 5 + [2] * 6] * 2)
    positions = jnp.array([list(range(5)) + list(range(6))] * 2)
    packed, _ = call(mixer, x, segment_ids, positions)
    second_alone, _ = call(mixer, x[:, 5:])
    np.testing.assert_allclose(packed[:, 5:], second_alone, atol=FP32_TOL, rtol=FP32_TOL)
    plain = ModelConfig(d_model=32, num_heads=2, max_seq_len=32)
    assert mixer_flops_per_token("attention", config, 11) - mixer_flops_per_token("attention", plain, 11) == (
        2 * 3 * (2 + 4) * 16)


def test_a_negative_convolution_width_is_rejected():
    with pytest.raises(ConfigError, match=r"model.attention.conv_kernel: must be >= 0, got -1"):
        load_config(None, ["model.attention.conv_kernel=-1"])
