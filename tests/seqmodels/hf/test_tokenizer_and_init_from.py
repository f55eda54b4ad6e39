"""``load_tokenizer`` / ``data.tokenizer: hf:DIR``, and ``train.py model.init_from=hf:DIR``."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import tiny_overrides, write_corpus
from flax import nnx

import export as export_entry
import train as train_entry
from seqmodels.config import ConfigError, DataConfig
from seqmodels.config_io import load_config
from seqmodels.data.errors import DataError
from seqmodels.data.document_rows import FrameDocument
from seqmodels.data.tokenizers import get_tokenizer
from seqmodels.hf import HFFormatError, load_pretrained, load_tokenizer, resolve_base
from seqmodels.hf.base import explicit_model_keys
from hf_models import byte_level_tokenizer, save_hf_model  # noqa: F401  (pytest fixtures)


def test_tokenizer_encodes_without_specials_and_names_its_special_ids(tmp_path, byte_level_tokenizer):
    tokenizer = load_tokenizer(byte_level_tokenizer(tmp_path / "tok"))
    ids = tokenizer.encode("héllo, wörld")
    assert len(ids) == len("héllo, wörld".encode()) and max(ids) < 256
    assert tokenizer.decode(ids) == "héllo, wörld"
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.vocab_size) == (256, 257, None, 258)


def test_data_tokenizer_hf_frames_documents_with_its_ids(tmp_path, byte_level_tokenizer):
    directory = byte_level_tokenizer(tmp_path / "tok")
    config = DataConfig(tokenizer=f"hf:{directory}")
    framed = FrameDocument(get_tokenizer(config.tokenizer))("abc")
    ids = load_tokenizer(directory).encode("abc")
    np.testing.assert_array_equal(framed["tokens"], [256, *ids, 257])
    np.testing.assert_array_equal(framed["loss_mask"], [0, 1, 1, 1, 1])


def test_data_tokenizer_naming_a_missing_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"data.tokenizer: hf:.*nowhere: no such directory"):
        DataConfig(tokenizer=f"hf:{tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match="must be byte or hf:DIR"):
        DataConfig(tokenizer="gpt2")


def test_tokenizer_without_an_eos_cannot_frame_documents(tmp_path, byte_level_tokenizer):
    directory = byte_level_tokenizer(tmp_path / "tok", eos=False)
    with pytest.raises(DataError, match="names no EOS token"):
        get_tokenizer(f"hf:{directory}")
    with pytest.raises(HFFormatError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_init_from_takes_the_model_section_and_refuses_a_conflicting_override(tmp_path, save_hf_model):
    directory, _ = save_hf_model("qwen2", True)
    init_from = f"model.init_from=hf:{directory}"
    config = resolve_base(load_config(None, [init_from, "model.compute_dtype=bfloat16", "data.seq_len=32"]))
    assert (config.model.d_model, config.model.num_heads, config.model.attention.num_kv_heads) == (64, 4, 2)
    assert config.model.attention.qkv_bias and config.model.compute_dtype == "bfloat16"
    assert config.model.max_seq_len == 64  # max_position_embeddings
    conflicting = [init_from, "model.d_model=128", "data.seq_len=32"]  # 128 is also the default
    with pytest.raises(ConfigError, match=r"model.d_model=128 conflicts with model.init_from=.*config.json gives 64"):
        resolve_base(load_config(None, conflicting), explicit_model_keys(None, conflicting))
    with pytest.raises(ConfigError, match=r"model.attention.rope_theta=10.0 conflicts .* gives 5000.0"):
        resolve_base(load_config(None, [init_from, "model.attention.rope_theta=10", "data.seq_len=32"]))
    agreeing = resolve_base(load_config(None, [init_from, "model.d_model=64", "data.seq_len=32"]))
    assert agreeing.model == dataclasses.replace(config.model, compute_dtype="float32")
    with pytest.raises(ConfigError, match="data.seq_len: 256 exceeds model.max_seq_len=64"):
        resolve_base(load_config(None, [init_from]))


@pytest.mark.slow
def test_train_py_continues_pretraining_from_the_hf_weights(tmp_path, save_hf_model, byte_level_tokenizer):
    directory, _ = save_hf_model("llama", False, config={"vocab_size": 300})
    byte_level_tokenizer(directory)
    run = tmp_path / "run"
    corpus = str(write_corpus(tmp_path / "corpus") / "*.txt")
    overrides = [o for o in tiny_overrides(run, corpus, train__steps=2, checkpoint__every_steps=2,
                                           optim__learning_rate=1e-9, optim__warmup_steps=0)
                 if not o.startswith("model.")]
    overrides += [f"model.init_from=hf:{directory}", f"data.tokenizer=hf:{directory}"]
    assert train_entry.main(overrides) == 0
    from seqmodels.runs.load import load_run
    config, model, _ = load_run(run)
    assert config.model.init_from == f"hf:{directory}" and config.model.d_model == 64
    trained = jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    start = jax.tree.leaves(nnx.to_pure_dict(nnx.state(load_pretrained(directory), nnx.Param)))
    for a, b in zip(trained, start):  # two steps at lr 1e-9 move a weight by ~2e-9
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7, rtol=0)
    assert export_entry.main(["--run", str(run), "--out", str(tmp_path / "exported")]) == 0
    exported = load_tokenizer(tmp_path / "exported")  # the run's hf: tokenizer travels with the export
    assert exported.encode("def f(x):") == load_tokenizer(directory).encode("def f(x):")
    hf_config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert (hf_config["bos_token_id"], hf_config["eos_token_id"]) == (256, 257)
