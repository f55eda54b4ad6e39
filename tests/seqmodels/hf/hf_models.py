"""Tiny random Hugging Face Llama / Qwen2 models and tokenizers, made and saved inside the tests (fixtures
and helpers the tests of seqmodels.hf import)."""

import json

import pytest

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            intermediate_size=96, vocab_size=97, max_position_embeddings=64)


def make_hf_model(architecture: str, *, tied: bool, seed: int = 0, **overrides):
    """A float32 ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (GQA: 4 query heads, 2 key/value heads) whose
    every weight, norm scale and bias is random (the default init leaves norms at 1 and biases at 0)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[architecture]
    model_class = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[architecture]
    config = config_class(**{**TINY, "rope_theta": 5000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": tied,
                             **overrides})
    model = model_class(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.copy_(0.15 * torch.randn_like(parameter))
    return model


@pytest.fixture
def hf_model_factory():
    """``make_hf_model`` for tests that write the model in another format."""
    return make_hf_model


@pytest.fixture
def byte_level_tokenizer():
    """``save_byte_level_tokenizer``: write a tiny Hugging Face tokenizer into a directory."""
    return save_byte_level_tokenizer


@pytest.fixture
def save_hf_model(tmp_path):
    """``save(architecture, tied, name="model", **save_kwargs) -> (directory, torch model)``."""
    def save(architecture: str, tied: bool, name: str = "model", seed: int = 0, config=None, **save_kwargs):
        model = make_hf_model(architecture, tied=tied, seed=seed, **(config or {}))
        directory = tmp_path / name
        model.save_pretrained(directory, **save_kwargs)
        return directory, model
    return save


def save_byte_level_tokenizer(directory, *, eos: bool = True):
    """A byte-level BPE ``tokenizer.json`` (256 byte tokens, no merges; 256 = <bos>, 257 = <eos>) in ``directory``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: index for index, token in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<bos>", special=True), AddedToken("<eos>", special=True)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    settings = {"bos_token": "<bos>", **({"eos_token": "<eos>"} if eos else {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory
