"""Fuzzing the Hugging Face readers: safetensors (one file, and shards with an index), config.json,
tokenizer.json with its settings, GGUF. Each case loads or raises ``HFFormatError`` naming the file."""

import json
import shutil

import numpy as np
import pytest

from fuzzing import FUZZ_CASES, SLOW_CASES, byte_cases, failures, json_cases, tree_snapshot
from seqmodels.config import ModelConfig
from seqmodels.errors import HFFormatError
from seqmodels.hf.formats import load_model_config
from seqmodels.hf.gguf import convert_gguf
from seqmodels.hf.safetensors_io import INDEX_FILE, SafetensorsCheckpoint, write_checkpoint, write_safetensors
from seqmodels.data.hf_tokenizer import load_tokenizer

BUDGETS = [pytest.param(FUZZ_CASES, 0, id="fast"), pytest.param(SLOW_CASES, 1, id="slow", marks=pytest.mark.slow)]
TENSORS = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.float16),
           "c": np.zeros((2, 2), np.float32)}


def _read_all(directory) -> None:
    checkpoint = SafetensorsCheckpoint(directory)
    for name in checkpoint.names():
        checkpoint.read(name)


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_a_damaged_safetensors_file_is_an_error_naming_it(tmp_path, count, seed):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, TENSORS)
    found = failures(byte_cases(path.read_bytes(), seed, count), path.write_bytes, lambda: _read_all(tmp_path))
    assert not found, "\n".join(found[:5])


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_a_damaged_safetensors_index_is_an_error_and_never_opens_a_file_outside(tmp_path, count, seed):
    directory = tmp_path / "model"
    directory.mkdir()
    write_checkpoint(directory, TENSORS, max_shard_bytes=64)
    write_safetensors(tmp_path / "outside", TENSORS)  # what '../outside' would name
    index = directory / INDEX_FILE
    opened = []
    original = SafetensorsCheckpoint.read

    def read_all():
        checkpoint = SafetensorsCheckpoint(directory)
        opened.extend(checkpoint.file_of(name) for name in checkpoint.names())
        for name in checkpoint.names():
            original(checkpoint, name)

    found = failures(json_cases(index, seed, count), index.write_bytes, read_all)
    assert not found, "\n".join(found[:5])
    assert all(path.parent == directory for path in opened)


@pytest.mark.parametrize("shard", ["../outside", "/etc/passwd", "sub/model.safetensors", "..", ""])
def test_an_index_naming_a_shard_outside_the_directory_is_refused(tmp_path, shard):
    directory = tmp_path / "model"
    directory.mkdir()
    write_safetensors(tmp_path / "outside", TENSORS)
    write_safetensors(directory / "model-00001-of-00001.safetensors", TENSORS)
    (directory / INDEX_FILE).write_text(json.dumps({"weight_map": {"a": shard}}))
    with pytest.raises(HFFormatError, match="is not a file name in"):
        SafetensorsCheckpoint(directory)


def _hf_config_dirs(tmp_path):
    from seqmodels.hf import llama, remote_code
    small = ModelConfig(d_model=16, num_heads=2, mixers=("attention",) * 2, vocab_size=40, max_seq_len=64)
    hybrid = ModelConfig(d_model=16, num_heads=2, mixers=("swa", "attention"), vocab_size=40, max_seq_len=64)
    configs = {"llama": llama.hf_config_from_model(small, torch_dtype="float32"),
               "seqmodels": remote_code.hf_config_from_model(hybrid, torch_dtype="float32")}
    dirs = {}
    for name, hf in configs.items():
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / "config.json").write_text(json.dumps(hf, indent=2))
        load_model_config(dirs[name])  # the unmutated file loads
    return dirs


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_a_damaged_config_json_is_an_error_naming_it(tmp_path, count, seed):
    found = []
    for directory in _hf_config_dirs(tmp_path).values():
        path = directory / "config.json"
        found += failures(json_cases(path, seed, count), path.write_bytes, lambda: load_model_config(directory))
    assert not found, "\n".join(found[:5])


def test_a_mistyped_rope_parameters_is_an_error_naming_config_json(tmp_path):
    directory = _hf_config_dirs(tmp_path)["llama"]
    hf = json.loads((directory / "config.json").read_text())
    for value in (["rope_theta", 10000], "default", 5):
        (directory / "config.json").write_text(json.dumps({**hf, "rope_parameters": value}))
        with pytest.raises(HFFormatError, match="config.json"):
            load_model_config(directory)


def _tokenizer_dir(tmp_path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = {token: index for index, token in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<bos>", special=True), AddedToken("<eos>", special=True)])
    directory = tmp_path / "tokenizer"
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    (directory / "config.json").write_text(json.dumps({"bos_token_id": 256, "eos_token_id": 257}))
    return directory


def _use_tokenizer(directory) -> None:
    tokenizer = load_tokenizer(directory)
    tokenizer.decode(tokenizer.encode("hello, world"))
    tokenizer.document_ids()


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_a_damaged_tokenizer_or_its_settings_is_an_error_naming_the_file(tmp_path, count, seed):
    directory = _tokenizer_dir(tmp_path)
    _use_tokenizer(directory)
    found = []
    for name, share in (("tokenizer.json", count // 2), ("tokenizer_config.json", count // 4),
                        ("config.json", count // 4)):
        path = directory / name
        original = path.read_bytes()
        found += failures(json_cases(path, seed, max(share, 4)), path.write_bytes, lambda: _use_tokenizer(directory))
        path.write_bytes(original)
    assert not found, "\n".join(found[:5])


def _write_tiny_gguf(path) -> None:
    """A one-layer Llama as llama.cpp writes one: metadata, a byte-level tokenizer, float32 tensors."""
    import gguf
    from tokenizers import pre_tokenizers
    d_model, heads, kv_heads, hidden = 8, 2, 1, 16
    tokens = ["<s>", "</s>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(d_model)
    writer.add_feed_forward_length(hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    writer.add_token_merges([])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    rng = np.random.default_rng(0)
    head_dim = d_model // heads
    shapes = {"token_embd.weight": (len(tokens), d_model), "output_norm.weight": (d_model,),
              "blk.0.attn_q.weight": (d_model, d_model), "blk.0.attn_k.weight": (kv_heads * head_dim, d_model),
              "blk.0.attn_v.weight": (kv_heads * head_dim, d_model), "blk.0.attn_output.weight": (d_model, d_model),
              "blk.0.ffn_gate.weight": (hidden, d_model), "blk.0.ffn_up.weight": (hidden, d_model),
              "blk.0.ffn_down.weight": (d_model, hidden), "blk.0.attn_norm.weight": (d_model,),
              "blk.0.ffn_norm.weight": (d_model,)}
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_a_damaged_gguf_file_is_an_error_and_writes_nothing(tmp_path, count, seed):
    path, out = tmp_path / "tiny.gguf", tmp_path / "out"
    _write_tiny_gguf(path)
    convert_gguf(path, out)  # the unmutated file converts
    shutil.rmtree(out)

    def convert():
        try:
            convert_gguf(path, out)
        finally:
            assert tree_snapshot(tmp_path) <= {path.relative_to(tmp_path), out.relative_to(tmp_path)} | {
                p.relative_to(tmp_path) for p in out.rglob("*")}
            shutil.rmtree(out, ignore_errors=True)

    found = failures(byte_cases(path.read_bytes(), seed, count), path.write_bytes, convert)
    assert not found, "\n".join(found[:5])
    assert tree_snapshot(tmp_path) == {path.relative_to(tmp_path)}  # no staging folder left behind
