"""Every config exports to PyTorch: float32 logits within 1e-4 (max abs) of JAX and 16 greedy tokens equal.

Tiny random models (``export_parity.tiny_config``: d_model 64, 2 layers) of every ``configs/*.yaml``
and ``configs/ablations/*.yaml`` (the AHN configs: the student at window 8 + 2 sinks on 24 tokens, read-out
maps non-zero, so each compressor contributes), plus a hybrid list through the seqmodels attention (GQA, q/k norm,
convolution, biases, untied head), and the looped model's accept / reject on 64 strings.
"""

import dataclasses

import numpy as np
import pytest
from export_parity import (BASE_CONFIG, CAUSAL_KINDS, CONFIGS, LOGIT_TOLERANCE, config_name, jax_logits, jax_model,
                           load_torch, measure_lm, parity_row, random_params, tiny_config)

from seqmodels.mixers import MIXERS
from seqmodels.mixers.attention import AttentionConfig

FAST = {"swa", "deltanet", "mamba2", "longhorn"}  # under ~20 s here; the others are marked slow
LM_CONFIGS = [path for path in CONFIGS if tiny_config(path).kind in CAUSAL_KINDS]  # the AHN configs too


def _case(path):
    marks = () if config_name(path) in FAST else (pytest.mark.slow,)
    return pytest.param(path, id=config_name(path), marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("path", [_case(path) for path in LM_CONFIGS])
def test_export_matches_jax_logits_and_greedy_tokens(tmp_path, path):
    config = tiny_config(path)
    result = measure_lm(config, random_params(config), tmp_path / "hf")
    print(parity_row(config_name(path), config, result))  # the README's table row (pytest -rP shows it)
    plain_llama = config.kind == "lm" and set(config.mixers) == {"attention"}
    expected = "LlamaForCausalLM" if plain_llama else "SeqmodelsForCausalLM"
    assert result["architecture"] == expected
    assert result["logit_scale"] > 1.0  # the tolerance is absolute on O(1) logits
    assert result["max_abs"] < LOGIT_TOLERANCE, result["max_abs"]
    assert result["cached_max_abs"] < LOGIT_TOLERANCE, result["cached_max_abs"]  # the decoding cache's recurrent form
    np.testing.assert_array_equal(result["torch_tokens"], result["jax_tokens"])
    if config.kind == "ahn":  # 24 tokens through a window of 8: the compressors' read-out is in the logits
        assert result["compressor_effect"] > 1e-2, result["compressor_effect"]


@pytest.mark.slow
def test_a_hybrid_list_through_the_seqmodels_attention_matches_jax(tmp_path):
    """``[swa, mamba2, attention]`` with grouped-query heads, q/k norm, a short convolution, q/k/v biases."""
    base = tiny_config(BASE_CONFIG)
    config = dataclasses.replace(
        base, mixers=("swa", "mamba2", "attention"), num_heads=4, tie_embeddings=False,
        attention=AttentionConfig(num_kv_heads=2, qk_norm=True, conv_kernel=3, qkv_bias=True, rope_theta=500.0))
    result = measure_lm(config, random_params(config), tmp_path / "hf")
    print(parity_row("hybrid (GQA, q/k norm, conv, biases)", config, result))
    assert result["architecture"] == "SeqmodelsForCausalLM" and result["logit_scale"] > 1.0
    assert result["max_abs"] < LOGIT_TOLERANCE and result["cached_max_abs"] < LOGIT_TOLERANCE, result
    np.testing.assert_array_equal(result["torch_tokens"], result["jax_tokens"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_registered_mixer_exports_with_jax_logits_and_greedy_tokens(tmp_path, name):
    """Two layers of each mixer in the registry, at its section's defaults (the default deep-memory Atlas
    included): a newly registered mixer is measured without a config or a test of its own."""
    config = dataclasses.replace(tiny_config(BASE_CONFIG), mixers=(name, name))
    result = measure_lm(config, random_params(config), tmp_path / "hf")
    print(parity_row(f"{name} x 2", config, result))
    assert result["architecture"] == ("LlamaForCausalLM" if name == "attention" else "SeqmodelsForCausalLM")
    assert result["logit_scale"] > 1.0  # the tolerance is absolute on O(1) logits
    assert result["max_abs"] < LOGIT_TOLERANCE and result["cached_max_abs"] < LOGIT_TOLERANCE, result
    np.testing.assert_array_equal(result["torch_tokens"], result["jax_tokens"])


SETTING_VARIANTS = {
    "muonssm_head_scope_polar_express": dict(
        mixers=("muonssm_gated_deltanet", "muonssm_mamba2", "muonssm_longhorn"),
        muonssm=dict(gamma=0.5, tau=0.7, ns_steps=3, ns_coefficients="polar_express", ns_scope="head"),
        mamba2=dict(gated_norm="per_head_before_gate", head_dim=32)),
    "muonssm_no_momentum_deltanet_widths": dict(
        mixers=("muonssm_gated_deltanet", "muonssm_mamba2", "deltanet"), muonssm=dict(gamma=0.0, ns_steps=2),
        deltanet=dict(head_dim=16, value_head_dim=24, conv_kernel=2)),
    "atlas_polar_express_unclipped_gradient_eta": dict(
        mixers=("atlas", "atlas_mal"), atlas=dict(ns_coefficients="polar_express", ns_steps=3, grad_clip=0.0,
                                                  eta_scales="gradient", poly_degree=3, poly_key_dim=3,
                                                  chunk_size=16, window=3)),  # 24 tokens: a partial last chunk
    "atlas_memory_norm_deep": dict(mixers=("atlas", "atlas_mag"), atlas=dict(memory_norm=True)),
    "atlas_memory_norm_linear": dict(mixers=("atlas",), atlas=dict(memory_norm=True, memory_depth=1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", SETTING_VARIANTS)
def test_mixer_settings_the_configs_leave_at_defaults_match_jax(tmp_path, variant):
    """Newton-Schulz schedules and scopes, momentum off, the per-head Mamba2 norm, uneven widths, Atlas's
    degree-3 features, unclipped gradients, eta on the gradient and a chunk that does not divide the row.

    (With chunk_size 5 the last setting is ill-conditioned: JAX's own chunked and reference forms then
    differ by 2e-3, so no export could match within 1e-4; at 16 they agree to 1e-5.)"""
    base = tiny_config(BASE_CONFIG)
    changes = dict(SETTING_VARIANTS[variant])
    sections = {name: dataclasses.replace(getattr(base, name), **changes.pop(name))
                for name in ("muonssm", "mamba2", "deltanet", "atlas") if name in changes}
    config = dataclasses.replace(base, **changes, **sections)
    result = measure_lm(config, random_params(config), tmp_path / "hf")
    print(parity_row(variant, config, result))
    assert result["logit_scale"] > 1.0
    assert result["max_abs"] < LOGIT_TOLERANCE and result["cached_max_abs"] < LOGIT_TOLERANCE, result
    np.testing.assert_array_equal(result["torch_tokens"], result["jax_tokens"])


LOOPED_VARIANTS = {
    "looped_cfl": {},
    "looped_gated_deltanet_distinct_blocks": dict(mixer="gated_deltanet", positions="rope+sinusoidal",
                                                  share_weights=False, loop_schedule="fixed", fixed_loops=3,
                                                  attention="bidirectional", reinject=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", LOOPED_VARIANTS)
def test_looped_export_agrees_on_accept_or_reject_of_64_strings(tmp_path, variant):
    import jax.numpy as jnp
    import torch

    from seqmodels.hf.export import export_model
    from seqmodels.special_tokens import ACCEPT_ID, REJECT_ID
    base = tiny_config(next(path for path in CONFIGS if path.stem == "looped_cfl"))
    config = dataclasses.replace(base, vocab_size=26, looped=dataclasses.replace(base.looped,
                                                                              **LOOPED_VARIANTS[variant]))
    params = random_params(config, noise=0.2)
    export_model(config, params, tmp_path / "hf")
    torch_model = load_torch(tmp_path / "hf", "AutoModelForSequenceClassification")
    assert type(torch_model).__name__ == "SeqmodelsLoopedForSequenceClassification"
    model, rng = jax_model(config, params), np.random.default_rng(0)
    decisions, differences = [], []
    for length in range(1, 9):  # 8 lengths x 8 strings: [BOS] w [CLS]
        tokens = np.concatenate([np.full((8, 1), 5), rng.integers(6, 26, size=(8, length)), np.full((8, 1), 2)], 1)
        logits = np.asarray(jax_logits(model, jnp.asarray(tokens)))
        with torch.no_grad():
            output = torch_model(torch.as_tensor(tokens))
        differences.append(np.abs(output["vocab_logits"].numpy() - logits).max())
        np.testing.assert_array_equal(output.logits.numpy(), output["vocab_logits"].numpy()[:, [REJECT_ID, ACCEPT_ID]])
        decisions.append((output.logits.numpy().argmax(-1), logits[:, ACCEPT_ID] > logits[:, REJECT_ID]))
    torch_accepts = np.concatenate([d[0] for d in decisions]) == 1
    jax_accepts = np.concatenate([d[1] for d in decisions])
    assert len(jax_accepts) == 64 and 0 < jax_accepts.sum() < 64  # both decisions occur
    np.testing.assert_array_equal(torch_accepts, jax_accepts)
    print(f"| {variant} | {config.looped.mixer} (looped) | SeqmodelsLoopedForSequenceClassification | "
          f"{max(differences):.2e} | accept/reject equal on 64: {bool(np.array_equal(torch_accepts, jax_accepts))} |")
    assert max(differences) < LOGIT_TOLERANCE, max(differences)
