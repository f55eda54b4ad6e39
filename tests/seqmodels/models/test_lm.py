"""The decoder LM: decoding with a cache, document isolation in packed rows, windows, remat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.layers.attention import visibility_mask
from seqmodels.mixers import MIXERS
from seqmodels.mixers.attention import AttentionConfig, SlidingWindowConfig
from seqmodels.models import build_model, generate
from seqmodels.models.lm import document_positions

# float32 on CPU: differences come from summation order only, far below 1e-4.
FP32_TOL = 1e-4


def small_config(**kwargs):
    defaults = dict(d_model=32, num_heads=4, mixers=("attention", "swa"), max_seq_len=64,
                    swa=SlidingWindowConfig(window=4, num_sinks=2))
    defaults.update(kwargs)
    return ModelConfig(**defaults)


@pytest.mark.slow
@pytest.mark.parametrize("mixers, kv_heads", [
    (("attention", "attention"), 0),
    (("swa", "attention"), 2),
    (("swa", "swa"), 1),
])
def test_generate_with_kv_cache_matches_full_forward_logits(mixers, kv_heads):
    config = small_config(mixers=mixers, attention=AttentionConfig(num_kv_heads=kv_heads))
    model = build_model(config, seed=1)
    prompt = jax.random.randint(jax.random.key(0), (2, 9), 0, config.vocab_size)
    tokens, logits = generate(model, prompt, 11)
    full, _ = model(tokens[:, :-1])
    assert tokens.shape == (2, 20) and logits.shape == full.shape
    np.testing.assert_allclose(logits, full, atol=FP32_TOL, rtol=FP32_TOL)
    assert np.array_equal(np.asarray(tokens[:, 9:]), np.asarray(jnp.argmax(full[:, 8:], -1)))


@pytest.mark.slow
def test_packed_documents_do_not_see_each_other():
    config = small_config(mixers=("attention", "swa"))
    model = build_model(config, seed=2)
    doc_a = jax.random.randint(jax.random.key(1), (1, 7), 0, 256)
    doc_b = jax.random.randint(jax.random.key(2), (1, 9), 0, 256)
    packed = jnp.concatenate([doc_a, doc_b], axis=1)
    segments = jnp.array([[1] * 7 + [2] * 9])
    logits_packed, _ = model(packed, segment_ids=segments)
    logits_a, _ = model(doc_a)
    logits_b, _ = model(doc_b)
    np.testing.assert_allclose(logits_packed[:, :7], logits_a, atol=FP32_TOL)
    np.testing.assert_allclose(logits_packed[:, 7:], logits_b, atol=FP32_TOL)
    # Without segment ids the second document does see the first: the test can fail.
    logits_joined, _ = model(packed)
    assert not np.allclose(logits_joined[:, 7:], logits_b, atol=1e-3)


def test_visibility_mask_matches_the_window_and_sink_rule_by_enumeration():
    segments = jnp.array([[1, 1, 1, 1, 1, 1, 2, 2, 2, 0]])
    positions = document_positions(segments)
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 0]]
    mask = np.asarray(visibility_mask(segments, positions, segments, positions, window=2, num_sinks=1))[0, 0]
    seg, pos = segments[0].tolist(), positions[0].tolist()
    for q in range(10):
        for k in range(10):
            expected = (seg[k] != 0 and seg[k] == seg[q] and pos[k] <= pos[q]
                        and (pos[q] - pos[k] < 2 or pos[k] < 1))
            assert mask[q, k] == expected, (q, k)


def test_sliding_window_output_ignores_tokens_outside_window_and_sinks():
    config = small_config(mixers=("swa",), mlp=False, swa=SlidingWindowConfig(window=3, num_sinks=1))
    model = build_model(config, seed=3)
    tokens = jax.random.randint(jax.random.key(4), (1, 12), 0, 256)
    changed = tokens.at[0, 5].set((tokens[0, 5] + 1) % 256)  # visible only to queries 5, 6, 7
    a, _ = model(tokens)
    b, _ = model(changed)
    differs = np.abs(np.asarray(a - b)).max(axis=-1)[0] > 1e-6
    assert differs.tolist() == [False] * 5 + [True] * 3 + [False] * 4


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "dots", "names"])
def test_remat_policies_give_the_same_gradients(policy):
    batch = {"inputs": jax.random.randint(jax.random.key(5), (2, 16), 0, 256),
             "targets": jax.random.randint(jax.random.key(6), (2, 16), 0, 256),
             "loss_mask": jnp.ones((2, 16))}

    def grads(config):
        from flax import nnx
        model = build_model(config, seed=0)
        graphdef, params = nnx.split(model)
        return jax.grad(lambda p: nnx.merge(graphdef, p).loss(batch)[0])(params)

    plain = grads(small_config())
    remat = grads(small_config(remat=policy))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-5), plain, remat)


def test_bfloat16_compute_stays_close_to_float32():
    tokens = jax.random.randint(jax.random.key(7), (2, 16), 0, 256)
    full, _ = build_model(small_config(), seed=0)(tokens)
    half, _ = build_model(small_config(compute_dtype="bfloat16"), seed=0)(tokens)
    assert half.dtype == jnp.float32  # logits are always float32
    # bf16 has 8 mantissa bits: expect about 1e-2 relative error in logits of unit scale.
    assert float(jnp.abs(full - half).max()) < 0.05 * float(jnp.abs(full).max()) + 1e-2


def test_unknown_mixer_and_bad_generate_arguments_are_reported():
    with pytest.raises(ConfigError, match="unknown mixer 'mamba9'"):
        build_model(small_config(mixers=("attention", "mamba9")))
    model = build_model(small_config())
    with pytest.raises(ValueError, match="exceeds model.max_seq_len=64"):
        generate(model, jnp.zeros((1, 60), jnp.int32), 10)
    with pytest.raises(ValueError, match="prompt must be an integer array"):
        generate(model, jnp.zeros((1, 4)), 2)


@pytest.mark.parametrize("policy,kept", [("full", set()), ("dots", {"dot"}), ("names", {"short_conv", "query"})])
def test_each_remat_policy_keeps_exactly_its_values(policy, kept):
    """``full`` keeps only the layer's input, ``dots`` the unbatched matmuls, ``names`` the named values."""
    from jax._src.ad_checkpoint import saved_residuals  # the public module exports only print_saved_residuals
    from jax.ad_checkpoint import checkpoint_name

    from seqmodels.models.lm import REMAT_POLICIES

    def layer(x, w):
        projected = checkpoint_name(jnp.tanh(x @ w), "query")
        convolved = checkpoint_name(jnp.cos(projected) * 2.0, "short_conv")
        return jnp.sum(jnp.sin(convolved) ** 2)

    saved = saved_residuals(jax.checkpoint(layer, policy=REMAT_POLICIES[policy]), jnp.ones((4, 8)), jnp.ones((8, 8)))
    found = set()
    for _, description in saved:
        if "argument" in description:
            continue
        names = {name for name in ("short_conv", "query") if name in description}
        found |= names or {"dot"}
    assert found == kept, [d for _, d in saved]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_registered_mixer_decodes_as_its_training_forward(name):
    """Prefill and token-by-token decoding with each mixer's cache give the training forward's logits, for
    every mixer in the registry at its section's defaults (the default deep-memory Atlas included), so a
    newly registered mixer is covered without a test of its own."""
    config = ModelConfig(d_model=32, num_heads=2, mixers=(name,), max_seq_len=64, kernel_impl="xla")
    model = build_model(config, seed=1)
    prompt = jax.random.randint(jax.random.key(0), (2, 7), 0, config.vocab_size)
    tokens, logits = generate(model, prompt, 9)
    full, _ = model(tokens[:, :-1])
    assert tokens.shape == (2, 16) and logits.shape == full.shape
    np.testing.assert_allclose(logits, full, atol=FP32_TOL, rtol=FP32_TOL)
    assert np.array_equal(np.asarray(tokens[:, 7:]), np.asarray(jnp.argmax(full[:, 6:], -1)))
