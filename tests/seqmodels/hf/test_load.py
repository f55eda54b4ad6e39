"""``load_pretrained``: tiny random Llama / Qwen2 models from ``transformers`` give the same logits and tokens."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from seqmodels.hf import HFFormatError, load_pretrained
from seqmodels.models.lm import generate
from hf_models import save_hf_model  # noqa: F401  (pytest fixtures)

CASES = [("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True)]


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.numpy()


@pytest.mark.parametrize("architecture,tied", CASES)
def test_logits_match_transformers_within_1e4(save_hf_model, architecture, tied):
    directory, reference = save_hf_model(architecture, tied)
    model = load_pretrained(directory)
    assert model.config.attention.num_kv_heads == 2 and model.config.tie_embeddings == tied
    assert model.config.attention.qkv_bias == (architecture == "qwen2")
    tokens = np.random.default_rng(0).integers(0, 97, size=(2, 48))
    expected = torch_logits(reference, tokens)
    logits, _ = model(jnp.asarray(tokens))
    assert float(np.abs(expected).max()) > 1.0  # the comparison is not of near-zero numbers
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("architecture,tied", [("llama", False), ("qwen2", True)])
def test_greedy_decoding_with_the_cache_gives_the_transformers_tokens(save_hf_model, architecture, tied):
    import torch
    directory, reference = save_hf_model(architecture, tied)
    model = load_pretrained(directory)
    prompt = np.random.default_rng(1).integers(0, 97, size=(2, 7))
    with torch.no_grad():
        expected = reference.generate(torch.as_tensor(prompt), max_new_tokens=12, do_sample=False,
                                      min_new_tokens=12, pad_token_id=0).numpy()
    tokens, _ = generate(model, prompt, 12)
    np.testing.assert_array_equal(np.asarray(tokens), expected)


def test_sharded_checkpoint_loads_like_the_single_file(save_hf_model):
    single, _ = save_hf_model("qwen2", False, name="single")
    sharded, _ = save_hf_model("qwen2", False, name="sharded", max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len({*json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"].values()}) > 2
    a, b = load_pretrained(single), load_pretrained(sharded)
    tokens = jnp.arange(20)[None] % 97
    np.testing.assert_array_equal(np.asarray(a(tokens)[0]), np.asarray(b(tokens)[0]))


def test_directory_without_config_json_is_refused(tmp_path):
    with pytest.raises(HFFormatError, match="no config.json"):
        load_pretrained(tmp_path)


def test_missing_shard_is_refused_naming_it(save_hf_model):
    directory, _ = save_hf_model("llama", False, max_shard_size="40KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (directory / shard).unlink()
    with pytest.raises(HFFormatError, match=f"shard {shard} is missing"):
        load_pretrained(directory)


def test_shape_that_does_not_match_the_config_is_refused(save_hf_model):
    directory, _ = save_hf_model("llama", False)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(HFFormatError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' "
                                            r"has shape \[96, 64\]; .*config\.json implies \[128, 64\]"):
        load_pretrained(directory)


@pytest.mark.parametrize("field,value,message", [
    ("architectures", ["MistralForCausalLM"], "architectures 'MistralForCausalLM' is not supported"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4}, "rope_parameters.rope_type 'llama3'"),
    ("attention_bias", True, "attention_bias = True is not implemented"),
    ("num_local_experts", 8, "num_local_experts = 8: mixture-of-experts"),
])
def test_unsupported_architecture_or_field_is_refused_by_name(save_hf_model, field, value, message):
    directory, _ = save_hf_model("llama", False)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(HFFormatError, match=f"config.json: {message}".replace("(", r"\(").replace("[", r"\[")):
        load_pretrained(directory)
