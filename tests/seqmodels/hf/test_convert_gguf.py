"""``convert_gguf``: a tiny Llama written with the ``gguf`` package's writer round-trips; SmolLM2-135M converts."""

import json

import numpy as np
import pytest

from seqmodels.hf import HFFormatError, load_pretrained, load_tokenizer
from seqmodels.hf.convert_gguf import convert_gguf, default_gguf_path, main
from seqmodels.hf.safetensors_io import SafetensorsCheckpoint
from hf_models import hf_model_factory  # noqa: F401  (pytest fixtures)

VOCAB = 300
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "Ġ w", "o r"]


def byte_level_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet, then the merged tokens, the specials and filler up to VOCAB."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    alphabet = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    tokens = SPECIALS + alphabet + [merge.replace(" ", "") for merge in MERGES]
    return tokens + [f"<filler_{i}>" for i in range(VOCAB - len(tokens))]


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to W_q / W_k rows (interleaving the two rotate-half halves)."""
    rows, columns = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2).reshape(rows, columns)


def write_tiny_gguf(path, model, *, architecture="llama", embed_type=None):
    """The HF ``model`` as a GGUF file the way llama.cpp writes one (q/k rows permuted, tokenizer inside)."""
    import gguf
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    tokens = byte_level_tokens()
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in SPECIALS else 1 for token in tokens])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                   "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                   "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                   "post_attention_layernorm": "ffn_norm"}
    for name, tensor in model.state_dict().items():
        array = tensor.numpy().astype(np.float32)
        if name.startswith("model.layers."):
            layer, rest = name.split(".", 3)[2:]
            module, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{layer}.{layer_names[module]}.{kind}"
            if module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = config.num_attention_heads if "q_proj" in module else config.num_key_value_heads
                array = llama_cpp_permute(array, heads)
        elif name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        else:
            gguf_name = names[name]
        if gguf_name == "token_embd.weight" and embed_type is not None:
            quantized = gguf.quants.quantize(array, embed_type)
            writer.add_tensor(gguf_name, quantized, raw_shape=quantized.shape, raw_dtype=embed_type)
        else:
            writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def converted(tmp_path, model, **write_kwargs):
    write_tiny_gguf(tmp_path / "tiny.gguf", model, **write_kwargs)
    return convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_gguf_round_trips_to_the_original_tensors(tmp_path, hf_model_factory, tied):
    model = hf_model_factory("llama", tied=tied, vocab_size=VOCAB)
    out = converted(tmp_path, model)
    checkpoint = SafetensorsCheckpoint(out)
    expected = {name: tensor.numpy() for name, tensor in model.state_dict().items()
                if not (tied and name == "lm_head.weight")}
    assert checkpoint.names() == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(checkpoint.read(name), value, err_msg=name)
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] == tied and config["num_key_value_heads"] == 2


@pytest.mark.slow
def test_converted_directory_loads_in_transformers_and_here_with_equal_logits(tmp_path, hf_model_factory):
    import gguf
    import torch
    import transformers
    model = hf_model_factory("llama", tied=False, vocab_size=VOCAB)
    out = converted(tmp_path, model, embed_type=gguf.GGMLQuantizationType.Q8_0)
    reference = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    embedding = reference.model.embed_tokens.weight.detach().numpy()
    original = model.model.embed_tokens.weight.detach().numpy()
    assert 0 < np.abs(embedding - original).max() < 0.05  # dequantised Q8_0: close, not equal
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, 40))
    with torch.no_grad():
        expected = reference(torch.as_tensor(tokens)).logits.numpy()
    logits, _ = load_pretrained(out)(tokens)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=0)


def test_converted_tokenizer_applies_the_merges_and_special_tokens(tmp_path, hf_model_factory):
    out = converted(tmp_path, hf_model_factory("llama", tied=True, vocab_size=VOCAB))
    tokenizer = load_tokenizer(out)
    tokens = byte_level_tokens()
    ids = tokenizer.encode("hello world 42")
    assert [tokens[i] for i in ids] == ["he", "ll", "o", "Ġw", "or", "l", "d", "Ġ", "4", "2"]
    assert tokenizer.decode(ids) == "hello world 42"
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.vocab_size) == (1, 2, VOCAB)
    assert tokenizer.decode([1, *ids, 2]) == "hello world 42"  # special tokens skipped


def test_unknown_architecture_is_refused_and_nothing_is_written(tmp_path, hf_model_factory):
    write_tiny_gguf(tmp_path / "tiny.gguf", hf_model_factory("llama", tied=True, vocab_size=VOCAB),
                    architecture="mamba")
    with pytest.raises(HFFormatError, match="tiny.gguf: general.architecture 'mamba' is not implemented"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_existing_output_directory_is_never_overwritten(tmp_path, hf_model_factory):
    write_tiny_gguf(tmp_path / "tiny.gguf", hf_model_factory("llama", tied=True, vocab_size=VOCAB))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    assert main(["--gguf", str(tmp_path / "tiny.gguf"), "--out", str(tmp_path / "hf")]) == 2
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "tiny.gguf"]


def stdlib_heldout_tokens(tokenizer, count: int) -> np.ndarray:
    """The first ``count`` tokens of the first held-out stdlib document that long (``data.source: stdlib``)."""
    from seqmodels.config import DataConfig
    from seqmodels.data import load_documents
    for text in load_documents(DataConfig()).heldout:
        ids = tokenizer.encode(text)
        if len(ids) >= count:
            return np.asarray([tokenizer.bos_id, *ids[:count - 1]], np.int32)
    raise AssertionError("no held-out stdlib document is long enough")


def perplexity(model, tokens: np.ndarray) -> float:
    import jax
    logits, _ = model(tokens[None, :-1])
    log_probs = jax.nn.log_softmax(logits[0], axis=-1)
    return float(np.exp(-np.mean(np.take_along_axis(np.asarray(log_probs), tokens[1:, None], axis=-1))))


@pytest.mark.slow
def test_smollm2_converts_predicts_python_source_and_answers_coherently(tmp_path):
    from seqmodels.models import build_model
    from seqmodels.models.lm import generate
    out = convert_gguf(default_gguf_path(), tmp_path / "smollm2")
    model, tokenizer = load_pretrained(out), load_tokenizer(out)
    assert (model.config.d_model, len(model.config.mixers), model.config.attention.num_kv_heads) == (576, 30, 3)
    tokens = stdlib_heldout_tokens(tokenizer, 384)
    trained = perplexity(model, tokens)
    untrained = perplexity(build_model(model.config, seed=0), tokens)
    print(f"SmolLM2-135M perplexity on 384 held-out stdlib tokens: {trained:.2f}; random weights: {untrained:.1f}")
    assert trained < 20.0 and trained < untrained / 100
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids = tokenizer.encode(prompt)  # the special tokens written in the text are recognised
    assert prompt_ids[0] == tokenizer.bos_id == 1  # <|im_start|>
    generated, _ = generate(model, np.asarray([prompt_ids]), 12)
    answer = tokenizer.decode(np.asarray(generated[0, len(prompt_ids):]))
    print(f"SmolLM2-135M greedy answer: {answer!r}")
    assert "Paris" in answer
