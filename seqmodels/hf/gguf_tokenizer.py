"""The ``tokenizer.json`` of a GGUF file's byte-level BPE vocabulary (``tokenizer.ggml.model = gpt2``).

GGUF stores the vocabulary (``tokenizer.ggml.tokens``, in id order), the merges (``"a b"`` strings, in
rank order), each token's type (3 = control: a special token) and the special ids. Rebuilt here as a
``tokenizers`` BPE model with the byte-level alphabet; the pre-tokenizer is the one llama.cpp applies
for ``tokenizer.ggml.pre`` (a registry: ``smollm`` splits digits one by one before the GPT-2 regex).
"""

from __future__ import annotations

from collections.abc import Callable

from seqmodels.hf.errors import HFFormatError

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
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
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
