"""``export.py`` / ``seqmodels.hf.export``: Transformer++ -> Hugging Face directory -> transformers and back."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import tiny_overrides, write_corpus
from flax import nnx

import export as export_entry
import train as train_entry
from seqmodels.config import ModelConfig
from seqmodels.hf import load_pretrained
from seqmodels.hf.export import export_model
from seqmodels.mixers.attention import AttentionConfig
from seqmodels.mixers.mamba2 import Mamba2Config
from seqmodels.models import build_model

LLAMA = ModelConfig(vocab_size=101, d_model=64, num_heads=4, mixers=("attention",) * 2, d_ff=96,
                    tie_embeddings=False, norm_eps=1e-5, attention=AttentionConfig(num_kv_heads=2, rope_theta=5e3))
QWEN2 = dataclasses.replace(LLAMA, tie_embeddings=True,
                            attention=dataclasses.replace(LLAMA.attention, qkv_bias=True))
# num_heads = the mixer's heads (expand d_model / head_dim), so the config reads back equal
MAMBA2 = ModelConfig(vocab_size=101, d_model=64, num_heads=4, mixers=("mamba2",) * 2, mlp=False, tie_embeddings=False,
                     norm_eps=1e-5, mamba2=Mamba2Config(state_dim=16, expand=2, head_dim=32, conv_kernel=4))


def random_params(config: ModelConfig, seed: int = 0) -> dict:
    """The model's parameters with every entry random (init leaves norms at 1 and biases at 0)."""
    params = nnx.to_pure_dict(nnx.state(build_model(config, seed=seed), nnx.Param))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [leaf + 0.15 * jax.random.normal(key, leaf.shape) for leaf, key in zip(leaves, keys)]
    return jax.tree.unflatten(tree, noisy)


@pytest.mark.slow
@pytest.mark.parametrize("config,architecture", [(LLAMA, "LlamaForCausalLM"), (QWEN2, "Qwen2ForCausalLM")])
def test_export_loads_in_transformers_with_logits_within_1e4(tmp_path, config, architecture):
    import torch
    import transformers
    params = random_params(config)
    out = export_model(config, params, tmp_path / "hf")
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == [architecture] and hf_config["torch_dtype"] == "float32"
    assert (out / "generation_config.json").is_file()
    reference = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reference).__name__ == architecture
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(2, 40))
    with torch.no_grad():
        expected = reference(torch.as_tensor(tokens)).logits.numpy()
    model = nnx.merge(nnx.split(build_model(config))[0], params)
    logits, _ = model(tokens)
    assert float(np.abs(expected).max()) > 1.0
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("config", [LLAMA, QWEN2])
def test_export_then_load_pretrained_is_bitwise(tmp_path, config):
    params = random_params(config)
    loaded = load_pretrained(export_model(config, params, tmp_path / "hf"))
    assert loaded.config == config
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(params),
                                 jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.state(loaded, nnx.Param)))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_bfloat16_export_holds_the_rounded_weights_and_shards_with_an_index(tmp_path):
    params = random_params(LLAMA)
    out = export_model(LLAMA, params, tmp_path / "hf", dtype="bfloat16", max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2 and not (out / "model.safetensors").exists()
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded = nnx.to_pure_dict(nnx.state(load_pretrained(out), nnx.Param))
    rounded = np.asarray(params["embed"]).astype(jax.numpy.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(loaded["embed"]), rounded)
    assert not np.array_equal(rounded, np.asarray(params["embed"]))


@pytest.mark.parametrize("change", [dict(mixers=("swa", "attention")), dict(attention=AttentionConfig(qk_norm=True))])
def test_what_a_llama_cannot_hold_exports_as_a_seqmodels_model(tmp_path, change):
    """A layer other than plain attention (or a setting Llama lacks) is exported with its own PyTorch modules."""
    config = dataclasses.replace(LLAMA, **change)
    out = export_model(config, random_params(config), tmp_path / "hf")
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["model_type"] == "seqmodels" and hf_config["architectures"] == ["SeqmodelsForCausalLM"]
    assert (out / "modeling_seqmodels.py").is_file()


@pytest.mark.slow
def test_export_py_writes_a_trained_run_that_loads_back_bitwise(tmp_path, capsys):
    run = tmp_path / "run"
    corpus = str(write_corpus(tmp_path / "corpus") / "*.txt")
    assert train_entry.main(tiny_overrides(run, corpus, train__steps=3, checkpoint__every_steps=3)) == 0
    out = tmp_path / "hf"
    assert export_entry.main(["--run", str(run), "--out", str(out)]) == 0
    assert "exported step 3" in capsys.readouterr().out
    from seqmodels.runs.load import load_run
    _, model, _ = load_run(run)
    expected = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    loaded = nnx.to_pure_dict(nnx.state(load_pretrained(out), nnx.Param))
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    from transformers import AutoTokenizer  # the run's byte tokenizer travels with it
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("héllo")["input_ids"] == [256, *"héllo".encode()] and tokenizer.eos_token_id == 257
    assert json.loads((out / "config.json").read_text())["bos_token_id"] == 256
    (out / "mine.txt").write_text("keep")
    assert export_entry.main(["--run", str(run), "--out", str(out)]) == 2  # an existing directory is kept
    assert "not an empty directory" in capsys.readouterr().err and (out / "mine.txt").read_text() == "keep"


def test_a_scanned_model_exports_its_layers_one_by_one(tmp_path):
    """model.scan_layers stacks the layers' parameters; the export holds each layer as Hugging Face does."""
    from seqmodels.models.stack import unstack_blocks

    scanned = dataclasses.replace(LLAMA, scan_layers=True)
    params = random_params(scanned)
    loaded = load_pretrained(export_model(scanned, params, tmp_path / "hf"))
    assert loaded.config == LLAMA  # the exported directory is a plain, unscanned Llama
    unrolled = nnx.to_pure_dict(nnx.state(loaded, nnx.Param))
    jax.tree.map(np.testing.assert_array_equal, unstack_blocks(params, repeats=2), unrolled)


def test_a_byte_level_export_carries_its_tokenizer_and_a_smaller_vocabulary_is_refused(tmp_path):
    from transformers import AutoTokenizer

    from seqmodels.errors import HFFormatError
    config = dataclasses.replace(LLAMA, vocab_size=258)
    out = export_model(config, random_params(config), tmp_path / "hf", tokenizer="byte")
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("a<bos>")["input_ids"] == [256, *b"a<bos>"]  # the text "<bos>" is its bytes, as in training
    for name in ("config.json", "generation_config.json"):
        ids = json.loads((out / name).read_text())
        assert (ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"]) == (256, 257, 257), name
    with pytest.raises(HFFormatError, match=r"has 258 ids but the model's vocabulary \(model.vocab_size\) is 101"):
        export_model(LLAMA, random_params(LLAMA), tmp_path / "small", tokenizer="byte")
    assert not (tmp_path / "small").exists()


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_a_mamba2_export_is_transformers_mamba2_with_jax_logits_and_greedy_tokens(tmp_path, tied):
    import torch
    import transformers

    from seqmodels.models.lm import generate
    config = dataclasses.replace(MAMBA2, tie_embeddings=tied)
    params = random_params(config)
    out = export_model(config, params, tmp_path / "hf")
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == ["Mamba2ForCausalLM"] and not (out / "modeling_seqmodels.py").exists()
    torch.set_num_threads(1)
    reference = transformers.AutoModelForCausalLM.from_pretrained(out).eval()  # no remote code
    assert type(reference).__name__ == "Mamba2ForCausalLM"
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(2, 40))
    with torch.no_grad():
        expected = reference(torch.as_tensor(tokens)).logits.numpy()
        greedy = reference.generate(torch.as_tensor(tokens[:, :8]), attention_mask=torch.ones((2, 8), dtype=torch.long),
                                    max_new_tokens=16, do_sample=False).numpy()
    model = nnx.merge(nnx.split(build_model(config))[0], params)
    logits, _ = model(tokens)
    print(f"Mamba2ForCausalLM (tied {tied}): max abs logit diff {np.abs(np.asarray(logits) - expected).max():.2e}, "
          f"logit scale {np.abs(expected).max():.2f}")
    assert float(np.abs(expected).max()) > 1.0
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(greedy, np.asarray(generate(model, tokens[:, :8], 16)[0]))
    loaded = load_pretrained(out)
    assert loaded.config == config
    jax.tree.map(np.testing.assert_array_equal, params, nnx.to_pure_dict(nnx.state(loaded, nnx.Param)))


@pytest.mark.parametrize("change", [
    pytest.param(dict(mlp=True), id="mlp"), pytest.param(dict(mixers=("mamba2", "swa")), id="hybrid"),
    pytest.param(dict(mamba2=Mamba2Config(head_dim=32, gated_norm="per_head_before_gate")), id="per_head_norm")])
def test_a_mamba2_the_reference_layout_cannot_hold_exports_with_its_own_modules(tmp_path, change):
    config = dataclasses.replace(MAMBA2, **change)
    out = export_model(config, random_params(config), tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["SeqmodelsForCausalLM"]
