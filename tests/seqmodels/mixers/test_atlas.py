"""The Atlas mixer in the model: features, decoding with a cache, configs, FLOPs, training from train.py."""

import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as train_entry
from conftest import tiny_overrides
from seqmodels.config import ConfigError, ModelConfig
from seqmodels.config_io import load_config, read_yaml
from seqmodels.mixers import mixer_flops_per_token
from seqmodels.mixers.atlas import AtlasConfig, feature_map, initial_coefficients
from seqmodels.mixers.attention import SlidingWindowConfig
from seqmodels.models import build_model, generate

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_polynomial_features_follow_the_documented_layout():
    key = jnp.asarray([[0.5, -0.5, 0.5, 0.5]])  # [H=1, K=4]
    coefficients = initial_coefficients(3)[None]  # [1, 3] = 1, 1/2, 1/6
    phi = feature_map(key, coefficients, 2)
    reduced = np.asarray(key[0, :2])
    expected = np.concatenate([np.asarray(key[0]), np.outer(reduced, reduced).ravel() / 2,
                               np.einsum("i,j,k->ijk", reduced, reduced, reduced).ravel() / 6])
    assert phi.shape == (1, 4 + 2**2 + 2**3)
    np.testing.assert_allclose(phi[0], expected, rtol=1e-6)
    assert feature_map(key, None, 2) is key  # degree 1: the identity


@pytest.mark.parametrize("override, message", [
    ("model.atlas.window=0", "model.atlas.window: must be >= 1, got 0"),
    ("model.atlas.chunk_size=0", "model.atlas.chunk_size: must be >= 1, got 0"),
    ("model.atlas.poly_degree=5", r"model.atlas.poly_degree: must be in \[1, 4\], got 5"),
    ("model.atlas.poly_degree=0", r"model.atlas.poly_degree: must be in \[1, 4\], got 0"),
    ("model.atlas.ns_steps=-1", r"model.atlas.ns_steps: must be in \[0, 10\], got -1"),
    ("model.atlas.ns_steps=11", r"model.atlas.ns_steps: must be in \[0, 10\], got 11"),
    ("model.atlas.memory_depth=0", r"model.atlas.memory_depth: must be 1 \(linear memory\) or 2"),
    ("model.atlas.alpha_range=[0.9, 0.5]", "model.atlas.alpha_range: is empty: low 0.9 > high 0.5"),
    ("model.atlas.eta_range=[0.2, 0.1]", "model.atlas.eta_range: is empty"),
    ("model.atlas.theta_range=[0.5, 1.5]", r"model.atlas.theta_range: must lie within \[0, 1.0\]"),
    ("model.atlas.eta_scales=memory", "model.atlas.eta_scales: must be auto, gradient or update, got .memory."),
    ("model.atlas.grad_clip=-0.5", r"model.atlas.grad_clip: must be >= 0 \(0 = off\), got -0.5"),
    ("model.atlas.gamma_range=[0.5]", r"model.atlas.gamma_range: must be \[low, high\]"),
    ("model.atlas.poly_key_dim=64", "model.atlas.poly_key_dim: 64 exceeds the head dimension"),
    ("model.atlas.ns_coefficients=newton", "model.atlas.ns_coefficients: must be muon or polar_express"),
    ("model.atlas.ns_granularity=row", "model.atlas.ns_granularity: must be token or chunk, got .row."),
])
def test_bad_atlas_settings_are_rejected_at_config_load_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.mixers=[atlas]", override])  # checked against the model where a layer uses it


@pytest.mark.slow
def test_generate_with_atlas_and_hybrid_caches_matches_the_training_form():
    # Chunks of 4 and a window of 3: the 9-token prefill ends mid-chunk and decoding crosses chunk starts.
    config = ModelConfig(d_model=32, num_heads=2, mixers=("atlas_mag", "atlas_mal"), max_seq_len=32,
                         kernel_impl="xla", swa=SlidingWindowConfig(window=5, num_sinks=1),
                         atlas=AtlasConfig(window=3, chunk_size=4, poly_key_dim=4, ns_steps=5))
    model = build_model(config, seed=1)
    prompt = jax.random.randint(jax.random.key(0), (2, 9), 0, config.vocab_size)
    tokens, logits = generate(model, prompt, 7)
    full, _ = model(tokens[:, :-1])
    # float32 through 5 Newton-Schulz steps per token (rounding amplified up to ~500x, see the
    # recurrence tests): logits of scale ~1 agree to 1e-4.
    assert logits.shape == full.shape == (2, 15, config.vocab_size)
    np.testing.assert_allclose(logits, full, atol=1e-4, rtol=0)
    assert np.array_equal(np.asarray(tokens[:, 9:]), np.asarray(jnp.argmax(full[:, 8:], -1)))


def test_atlas_flops_follow_the_documented_formula():
    config = ModelConfig(d_model=64, num_heads=2, mixers=("atlas",),
                         atlas=AtlasConfig(window=3, chunk_size=8, poly_degree=2, poly_key_dim=4, ns_steps=5,
                                           memory_depth=2, memory_expansion=2))
    d, heads, dim = 64, 2, 32
    features, hidden = dim + 16, 64  # F = D + R^2, E = 2 D
    size = features * hidden + hidden * dim
    projections = 2 * d * 4 * heads * dim + 2 * d * 4 * heads + 2 * heads * dim * d
    # W1 [F, E] with F = 48 < E = 64, and W2 [E, D] with D = 32 < E: each on its smaller Gram side.
    ns_step = (4 * features**2 * hidden + 2 * features**3) + (4 * dim**2 * hidden + 2 * dim**3)
    evaluated = (8 + 3 - 1) / 8  # the chunk's 8 tokens and the 2 carried ones, per token
    inner = 2 * (2 * size + 2 * hidden * dim) * evaluated
    window = 3 * size * evaluated  # rank-1 gradients as matrices, then the running sum's add and subtract
    per_head = inner + window + 5 * ns_step + 2 * size
    assert mixer_flops_per_token("atlas", config, 128) == projections + heads * per_head
    swa = mixer_flops_per_token("swa", config, 128)
    assert mixer_flops_per_token("atlas_mag", config, 128) == projections + heads * per_head + swa + 2 * d * d


def model_section(path):
    return read_yaml(path)["model"]


def test_configs_load_and_each_ablation_flips_one_knob_of_atlas():
    base = model_section(CONFIGS / "atlas.yaml")
    for name in ("atlas", "titans", "omeganet", "atlas_mag", "atlas_mal"):
        load_config(CONFIGS / f"{name}.yaml")
    titans = load_config(CONFIGS / "titans.yaml").model.atlas
    assert (titans.window, titans.poly_degree, titans.ns_steps) == (1, 1, 0)
    flipped = {}
    for path in sorted((CONFIGS / "ablations").glob("atlas_*.yaml")):
        load_config(path)
        section = model_section(path)
        assert {k: v for k, v in section.items() if k != "atlas"} == {k: v for k, v in base.items() if k != "atlas"}
        changes = {k: (base["atlas"][k], v) for k, v in section["atlas"].items() if base["atlas"][k] != v}
        assert len(changes) == 1, (path.name, changes)
        flipped.update(changes)
    assert flipped == {"window": (8, 1), "poly_degree": (2, 1), "ns_steps": (5, 0), "memory_depth": (2, 1)}


@pytest.mark.slow
@pytest.mark.parametrize("config", ["titans.yaml", "omeganet.yaml"])
def test_titans_and_omeganet_train_from_train_py(tmp_path, tiny_corpus, config):
    args = ["--config", str(CONFIGS / config)] + tiny_overrides(
        tmp_path / "run", tiny_corpus, model__mixers="[atlas]", model__atlas__poly_key_dim=4,
        model__kernel_impl="xla", train__steps=3, checkpoint__every_steps=10)
    assert train_entry.main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]  # three AdamW steps at lr 3e-3 on a tiny corpus reduce the loss


def test_eta_scales_auto_puts_eta_on_the_update_whenever_newton_schulz_runs():
    assert AtlasConfig().eta_scales == "auto" and AtlasConfig().eta_rule == "update"  # ns_steps 5
    assert AtlasConfig(ns_steps=0).eta_rule == "gradient"  # Titans' momentum
    assert AtlasConfig(ns_steps=5, eta_scales="gradient").eta_rule == "gradient"
    assert AtlasConfig(ns_steps=0, eta_scales="update").eta_rule == "update"


def _atlas_output(eta_high, **atlas):
    from flax import nnx
    from seqmodels.mixers import build_mixer
    config = ModelConfig(d_model=32, num_heads=2, max_seq_len=32, kernel_impl="xla", init_std=0.2,
                         atlas=AtlasConfig(window=2, chunk_size=4, poly_key_dim=4, theta_range=(0.0, 0.0),
                                           eta_range=(0.0, eta_high), **atlas))
    x = jax.random.normal(jax.random.key(0), (1, 12, 32))
    return np.asarray(build_mixer("atlas", config, nnx.Rngs(3))(x)[0])


@pytest.mark.slow
def test_with_newton_schulz_only_the_update_rule_gives_the_memory_a_step_size():
    # theta = 0: S_t is the (scaled) window gradient. NS_k is scale-invariant, so eta on the gradient
    # (eta_t proportional to eta_high) cancels, while eta on NS_k(S_t) scales every memory increment.
    gradient = [_atlas_output(high, eta_scales="gradient") for high in (0.05, 0.1)]
    # float32 rounding through 5 Newton-Schulz steps (amplified up to ~500x, see the recurrence tests): 2e-4.
    np.testing.assert_allclose(gradient[0], gradient[1], atol=2e-4)
    update = [_atlas_output(high) for high in (0.05, 0.1)]  # the default: auto -> update
    assert np.abs(update[0] - update[1]).max() > 1e-2


@pytest.mark.slow
def test_memory_norm_gives_each_head_a_gain_and_decodes_like_the_training_form():
    # A linear memory with the norm: a random M_0 (LayerNorm of a zero branch has no direction), one
    # gain [H, D] at 1, and generation with the cache equal to the training form (chunks of 4, window 2).
    config = ModelConfig(d_model=32, num_heads=2, mixers=("atlas",), max_seq_len=32, kernel_impl="xla",
                         atlas=AtlasConfig(window=2, chunk_size=4, poly_key_dim=4, ns_steps=1, memory_depth=1,
                                           memory_norm=True))
    model = build_model(config, seed=1)
    mixer = model.blocks[0].mixer
    np.testing.assert_array_equal(mixer.memory_gain.get_value(), np.ones((2, 16)))
    assert float(jnp.abs(mixer.initial_memory[0].get_value()).min()) > 0
    assert build_model(dataclasses.replace(config, atlas=dataclasses.replace(config.atlas, memory_norm=False)),
                       seed=1).blocks[0].mixer.memory_gain is None
    prompt = jax.random.randint(jax.random.key(0), (2, 6), 0, config.vocab_size)
    tokens, logits = generate(model, prompt, 4)
    full, _ = model(tokens[:, :-1])
    np.testing.assert_allclose(logits, full, atol=1e-4, rtol=0)  # float32 through one NS step per token


def test_memory_norm_flops_add_the_documented_layer_norm_term():
    atlas = AtlasConfig(window=3, chunk_size=8, poly_key_dim=4, ns_steps=5)
    plain = ModelConfig(d_model=64, num_heads=2, mixers=("atlas",), atlas=atlas)
    normed = dataclasses.replace(plain, atlas=dataclasses.replace(atlas, memory_norm=True))
    dim = 32
    expected = 2 * (20 * dim * (8 + 3 - 1) / 8 + 8 * dim)  # two heads
    difference = mixer_flops_per_token("atlas", normed, 128) - mixer_flops_per_token("atlas", plain, 128)
    assert difference == pytest.approx(expected)


def test_ns_granularity_is_listed_by_help_config_and_reaches_the_op():
    from seqmodels.config_io import help_text
    from seqmodels.mixers.atlas import atlas_settings
    lines = {line.split(" = ")[0]: line for line in help_text().splitlines()}
    assert lines["model.atlas.ns_granularity"].endswith("(one of: token | chunk)")
    assert "departure" in lines["model.atlas.ns_granularity"]
    config = load_config(None, ["model.mixers=[atlas]", "model.atlas.ns_granularity=chunk"]).model
    assert atlas_settings(config).ns_granularity == "chunk"
    assert load_config(None, ["model.mixers=[atlas]"]).model.atlas.ns_granularity == "token"


def test_chunk_granularity_flops_count_newton_schulz_once_per_chunk():
    atlas = AtlasConfig(window=3, chunk_size=8, poly_key_dim=4, ns_steps=5, memory_depth=2, memory_expansion=2)
    token = ModelConfig(d_model=64, num_heads=2, mixers=("atlas",), atlas=atlas)
    chunk = dataclasses.replace(token, atlas=dataclasses.replace(atlas, ns_granularity="chunk"))
    features, hidden, dim = 48, 64, 32
    size, span = features * hidden + hidden * dim, 8 + 3 - 1
    ns_step = (4 * features**2 * hidden + 2 * features**3) + (4 * dim**2 * hidden + 2 * dim**3)
    # Both: the inner gradients; token: window sum, NS every token, read-out; chunk: the dual form's reads,
    # then S_end and one NS per chunk of 8.
    token_part = 3 * size * span / 8 + 5 * ns_step + 2 * size
    chunk_part = (6 * size + 2 * (features + hidden) * span + 2 * (hidden + dim) * span + 4 * 8 * span
                  + (2 * size * span + 5 * ns_step) / 8)
    difference = mixer_flops_per_token("atlas", token, 128) - mixer_flops_per_token("atlas", chunk, 128)
    assert difference == pytest.approx(2 * (token_part - chunk_part))  # two heads
    assert mixer_flops_per_token("atlas", chunk, 128) < mixer_flops_per_token("atlas", token, 128) / 4


@pytest.mark.slow
def test_generate_with_chunk_granularity_matches_the_training_form():
    # Chunks of 4: the 6-token prefill ends mid-chunk and decoding crosses two chunk ends (NS_k there).
    config = ModelConfig(d_model=32, num_heads=2, mixers=("atlas", "atlas_mal"), max_seq_len=32, kernel_impl="xla",
                         swa=SlidingWindowConfig(window=5, num_sinks=1),
                         atlas=AtlasConfig(window=3, chunk_size=4, poly_key_dim=4, ns_steps=5,
                                           ns_granularity="chunk"))
    model = build_model(config, seed=1)
    prompt = jax.random.randint(jax.random.key(0), (2, 6), 0, config.vocab_size)
    tokens, logits = generate(model, prompt, 8)
    full, _ = model(tokens[:, :-1])
    np.testing.assert_allclose(logits, full, atol=1e-4, rtol=0)  # float32 through 5 NS steps per chunk
    token_config = dataclasses.replace(config, atlas=dataclasses.replace(config.atlas, ns_granularity="token"))
    token_full, _ = build_model(token_config, seed=1)(tokens[:, :-1])
    assert float(jnp.abs(token_full - full).max()) > 1e-3  # the granularity changes the model


def test_export_refuses_chunk_granularity_naming_the_key(tmp_path):
    from seqmodels.errors import HFFormatError
    from seqmodels.hf.export import export_model
    from flax import nnx
    config = ModelConfig(d_model=32, num_heads=2, mixers=("atlas",), max_seq_len=32, vocab_size=64,
                         atlas=AtlasConfig(window=2, chunk_size=4, poly_key_dim=4, ns_steps=1, memory_depth=1,
                                           ns_granularity="chunk"))
    params = nnx.to_pure_dict(nnx.state(build_model(config, seed=0), nnx.Param))
    with pytest.raises(HFFormatError, match="model.atlas.ns_granularity='chunk' has no PyTorch form"):
        export_model(config, params, tmp_path / "out")
    assert not (tmp_path / "out" / "config.json").exists()
