"""The Llama / Qwen2 safetensors format: a Hugging Face ``config.json`` + ``model.safetensors`` that
``transformers`` loads with no remote code, read into and written from the project's Transformer++.

The config. Both architectures are Transformer++ exactly: pre-RMSNorm blocks of causal attention with
RoPE in the rotate-half layout (``seqmodels.layers.rotary``) and a SwiGLU MLP, so each maps onto
``model.mixers = [attention] * num_hidden_layers`` with these fields:

    hidden_size -> d_model             num_attention_heads -> num_heads     intermediate_size -> d_ff
    num_key_value_heads -> attention.num_kv_heads (GQA)                   head_dim -> attention.head_dim
    rope_theta / rope_parameters.rope_theta -> attention.rope_theta       rms_norm_eps -> norm_eps
    tie_word_embeddings -> tie_embeddings      vocab_size      max_position_embeddings -> max_seq_len
    Qwen2: q/k/v biases -> attention.qkv_bias = true

A field whose value the project does not implement (RoPE scaling, biases on the output projection or
the MLP, sliding windows, experts, partial rotary) is refused by name rather than silently dropped.
Only a model of that shape is written in this format (``check_exportable``; with q/k/v biases as
``Qwen2ForCausalLM``, else ``LlamaForCausalLM``).

The tensors. PyTorch ``nn.Linear`` stores ``W [out, in]`` and computes ``x W^T``; the project's ``Dense``
stores ``kernel [in, *out]`` (heads split out) and computes ``x kernel``. So, per layer ``i``
(``model.layers.{i}.`` in Hugging Face, ``blocks/{i}/`` here):

    self_attn.q_proj.weight [H Dh, D]  -> mixer/query/kernel [D, H, Dh]    = W^T reshaped   (k, v: Hkv)
    self_attn.q_proj.bias   [H Dh]     -> mixer/query/bias   [H, Dh]                         (Qwen2)
    self_attn.o_proj.weight [D, H Dh]  -> mixer/out/kernel   [H, Dh, D]    = W^T reshaped
    mlp.{gate,up}_proj.weight [F, D]   -> mlp/{gate,up}/kernel [D, F]      = W^T
    mlp.down_proj.weight    [D, F]     -> mlp/down/kernel    [F, D]        = W^T
    input_layernorm / post_attention_layernorm.weight -> mixer_norm / mlp_norm /scale

and ``model.embed_tokens.weight [V, D] -> embed``, ``model.norm.weight -> final_norm/scale``,
``lm_head.weight [V, D] -> head [D, V]`` (absent with tied embeddings). Each rule is a bijection, so
an export loads back bitwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.hf.directory import write_json
from seqmodels.errors import HFFormatError
from seqmodels.hf.safetensors_io import write_checkpoint
from seqmodels.hf.tensor_rules import TensorRule, fill_params, tensors_of
from seqmodels.models import abstract_model

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints store; recomputed from rope_theta


@dataclass(frozen=True)
class Architecture:
    """One supported ``architectures`` entry: its ``model_type`` and whether q/k/v carry biases."""

    model_type: str
    qkv_bias: bool
    refused: tuple[tuple[str, object], ...]  # (field, the only accepted value) pairs


ARCHITECTURES = {
    "LlamaForCausalLM": Architecture("llama", qkv_bias=False,
                                     refused=(("attention_bias", False), ("mlp_bias", False))),
    "Qwen2ForCausalLM": Architecture("qwen2", qkv_bias=True, refused=(("use_sliding_window", False),)),
}
MODEL_TYPES = tuple(architecture.model_type for architecture in ARCHITECTURES.values())  # config.json's model_type
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def _field(hf: dict, name: str, source: str, default=None):
    value = hf.get(name, default)
    if value is None:
        raise HFFormatError(f"{source}: field {name!r} is missing")
    return value


def architecture_of(hf: dict, source: str) -> str:
    """The one supported entry of ``architectures`` in ``hf``, else ``HFFormatError`` naming it."""
    names = hf.get("architectures")
    if not isinstance(names, list) or len(names) != 1:
        raise HFFormatError(f"{source}: field 'architectures' must list one architecture, got {names!r}")
    if names[0] not in ARCHITECTURES:
        raise HFFormatError(f"{source}: architectures {names[0]!r} is not supported; supported: "
                            f"{', '.join(sorted(ARCHITECTURES))}")
    return names[0]


def rope_theta_of(hf: dict, source: str) -> float:
    """RoPE base from ``rope_parameters`` (transformers >= 5) or ``rope_theta``; only unscaled RoPE is accepted."""
    parameters = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for field, table in (("rope_parameters", parameters), ("rope_scaling", scaling)):
        kind = table.get("rope_type", table.get("type", "default"))
        if kind != "default":
            raise HFFormatError(f"{source}: {field}.rope_type {kind!r} is not implemented (only 'default' RoPE)")
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise HFFormatError(f"{source}: partial_rotary_factor {hf['partial_rotary_factor']} is not implemented "
                            "(RoPE over the whole head)")
    theta = parameters.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise HFFormatError(f"{source}: neither 'rope_theta' nor 'rope_parameters.rope_theta' is given")
    return float(theta)


def _check_refused(hf: dict, architecture: Architecture, source: str) -> None:
    for field, accepted in architecture.refused:
        if hf.get(field, accepted) != accepted:
            raise HFFormatError(f"{source}: {field} = {hf[field]!r} is not implemented (only {accepted!r})")
    for field in _MOE_FIELDS:
        if hf.get(field):
            raise HFFormatError(f"{source}: {field} = {hf[field]!r}: mixture-of-experts layers are not implemented")
    if hf.get("hidden_act", "silu") != "silu":
        raise HFFormatError(f"{source}: hidden_act {hf['hidden_act']!r} is not implemented (SwiGLU uses 'silu')")
    kinds = set(hf.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise HFFormatError(f"{source}: layer_types {sorted(kinds)} are not implemented (only 'full_attention')")


def model_config_from_hf(hf: dict, source: str = "config.json", base: ModelConfig | None = None) -> ModelConfig:
    """The ``ModelConfig`` of the Llama / Qwen2 ``config.json`` dict ``hf``.

    Settings that are not the architecture (``compute_dtype``, ``remat``, ``kernel_impl``,
    ``attention.implementation``, ``init_std``) are taken from ``base`` (default: the defaults).
    """
    architecture = ARCHITECTURES[architecture_of(hf, source)]
    _check_refused(hf, architecture, source)
    d_model = int(_field(hf, "hidden_size", source))
    heads = int(_field(hf, "num_attention_heads", source))
    head_dim = int(hf.get("head_dim") or (d_model // heads))
    base = base or ModelConfig()
    attention = dataclasses.replace(
        base.attention, num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=0 if head_dim * heads == d_model else head_dim, qkv_bias=architecture.qkv_bias,
        rope_theta=rope_theta_of(hf, source), qk_norm=False, conv_kernel=0, causal=True)
    try:
        return dataclasses.replace(
            base, kind="lm", vocab_size=int(_field(hf, "vocab_size", source)), d_model=d_model, num_heads=heads,
            mixers=("attention",) * int(_field(hf, "num_hidden_layers", source)), mlp=True,
            d_ff=int(_field(hf, "intermediate_size", source)), norm_eps=float(_field(hf, "rms_norm_eps", source)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_seq_len=int(hf.get("max_position_embeddings") or base.max_seq_len), attention=attention)
    except ConfigError as error:
        raise HFFormatError(f"{source}: describes a model the project cannot build: {error}") from None


def check_exportable(model: ModelConfig) -> None:
    """Raise ``HFFormatError`` unless ``model`` is Transformer++ in the settings a Llama / Qwen2 holds."""
    if model.kind != "lm":
        raise HFFormatError(f"model.kind {model.kind!r} has no Hugging Face equivalent; only the decoder LM exports")
    for index, name in enumerate(model.mixers):
        if name != "attention":
            raise HFFormatError(f"layer {index} is mixer {name!r}: only Transformer++ (every layer 'attention') "
                                "is a Hugging Face Llama / Qwen2 (other architectures export as model_type "
                                "seqmodels)")
    settings = {"model.mlp": (model.mlp, True), "model.attention.qk_norm": (model.attention.qk_norm, False),
                "model.attention.conv_kernel": (model.attention.conv_kernel, 0),
                "model.attention.causal": (model.attention.causal, True)}
    for key, (value, needed) in settings.items():
        if value != needed:
            raise HFFormatError(f"{key} = {value!r} has no Llama / Qwen2 equivalent (export needs {needed!r})")


def hf_config_from_model(model: ModelConfig, *, torch_dtype: str, token_ids: dict | None = None) -> dict:
    """The ``config.json`` dict of ``model``: ``Qwen2ForCausalLM`` with q/k/v biases, else ``LlamaForCausalLM``."""
    check_exportable(model)
    name = "Qwen2ForCausalLM" if model.attention.qkv_bias else "LlamaForCausalLM"
    theta = model.attention.rope_theta
    hf = {"architectures": [name], "model_type": ARCHITECTURES[name].model_type, "hidden_act": "silu",
          "hidden_size": model.d_model, "intermediate_size": model.mlp_hidden,
          "num_hidden_layers": len(model.mixers), "num_attention_heads": model.num_heads,
          "num_key_value_heads": model.attention.num_kv_heads or model.num_heads,
          "head_dim": model.attention_head_dim, "max_position_embeddings": model.max_seq_len,
          "rms_norm_eps": model.norm_eps, "rope_theta": theta,
          "rope_parameters": {"rope_type": "default", "rope_theta": theta},
          "tie_word_embeddings": model.tie_embeddings, "vocab_size": model.vocab_size,
          "attention_dropout": 0.0, "initializer_range": model.init_std, "use_cache": True,
          "torch_dtype": torch_dtype, "dtype": torch_dtype}
    if name == "LlamaForCausalLM":
        hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=len(model.mixers))
    hf.update({key: value for key, value in (token_ids or {}).items() if value is not None})
    return hf


def _same(x):
    return x


def _projection_in(heads: int, head_dim: int):
    """``W [heads * head_dim, D]`` <-> ``kernel [D, heads, head_dim]``."""
    return (lambda w: w.T.reshape(w.shape[1], heads, head_dim),
            lambda k: k.reshape(k.shape[0], heads * head_dim).T)


def _bias(heads: int, head_dim: int):
    return lambda b: b.reshape(heads, head_dim), lambda b: b.reshape(heads * head_dim)


def _projection_out(heads: int, head_dim: int):
    """``W [D, heads * head_dim]`` <-> ``kernel [heads, head_dim, D]``."""
    return (lambda w: w.T.reshape(heads, head_dim, w.shape[0]),
            lambda k: k.reshape(heads * head_dim, k.shape[-1]).T)


def _transpose():
    return (lambda w: w.T, lambda k: k.T)


def _layer_rules(layer: int, config: ModelConfig) -> list[TensorRule]:
    heads, kv_heads = config.num_heads, config.attention.num_kv_heads or config.num_heads
    head_dim = config.attention_head_dim
    hf, ours = f"model.layers.{layer}.", ("blocks", layer)
    maps = {
        "self_attn.q_proj.weight": (("mixer", "query", "kernel"), _projection_in(heads, head_dim)),
        "self_attn.k_proj.weight": (("mixer", "key", "kernel"), _projection_in(kv_heads, head_dim)),
        "self_attn.v_proj.weight": (("mixer", "value", "kernel"), _projection_in(kv_heads, head_dim)),
        "self_attn.o_proj.weight": (("mixer", "out", "kernel"), _projection_out(heads, head_dim)),
        "mlp.gate_proj.weight": (("mlp", "gate", "kernel"), _transpose()),
        "mlp.up_proj.weight": (("mlp", "up", "kernel"), _transpose()),
        "mlp.down_proj.weight": (("mlp", "down", "kernel"), _transpose()),
        "input_layernorm.weight": (("mixer_norm", "scale"), (_same, _same)),
        "post_attention_layernorm.weight": (("mlp_norm", "scale"), (_same, _same)),
    }
    if config.attention.qkv_bias:
        maps.update({
            "self_attn.q_proj.bias": (("mixer", "query", "bias"), _bias(heads, head_dim)),
            "self_attn.k_proj.bias": (("mixer", "key", "bias"), _bias(kv_heads, head_dim)),
            "self_attn.v_proj.bias": (("mixer", "value", "bias"), _bias(kv_heads, head_dim)),
        })
    return [TensorRule(hf + name, ours + path, *layout) for name, (path, layout) in maps.items()]


def tensor_rules(config: ModelConfig) -> list[TensorRule]:
    """Every tensor of the Hugging Face checkpoint of ``config`` (a Transformer++ ``ModelConfig``)."""
    rules = [TensorRule("model.embed_tokens.weight", ("embed",), _same, _same)]
    for layer in range(len(config.mixers)):
        rules += _layer_rules(layer, config)
    rules.append(TensorRule("model.norm.weight", ("final_norm", "scale"), _same, _same))
    if not config.tie_embeddings:
        rules.append(TensorRule("lm_head.weight", ("head",), *_transpose()))
    return rules


def read_config(hf: dict, source: str, base: ModelConfig | None = None) -> ModelConfig:
    """The ``ModelConfig`` of a Llama / Qwen2 ``config.json`` (``model_config_from_hf``)."""
    return model_config_from_hf(hf, source, base)


def _tolerated(config: ModelConfig):
    """Tensors a checkpoint may hold beyond the rules: stored RoPE buffers, a tied head's copy."""
    return lambda name: name.endswith(IGNORED_SUFFIXES) or (config.tie_embeddings and name == "lm_head.weight")


def read_params(directory: Path, config: ModelConfig) -> dict:
    """The float32 parameter dict of the Llama / Qwen2 checkpoint in ``directory`` for ``config``."""
    _, abstract_state = abstract_model(config)
    return fill_params(directory, tensor_rules(config), nnx.to_pure_dict(abstract_state), _tolerated(config))


def write_files(directory: Path, hf_config: dict, tensors: dict, *, max_shard_bytes: int) -> None:
    """``model.safetensors`` (or shards and their index above ``max_shard_bytes``) and ``config.json``."""
    write_checkpoint(directory, tensors, max_shard_bytes=max_shard_bytes)
    write_json(directory / "config.json", hf_config)


def write(directory: Path, config: ModelConfig, params: dict, *, dtype: str, token_ids: dict,
          max_shard_bytes: int) -> None:
    """Write the checkpoint and ``config.json`` of ``config`` with ``params`` into the new directory."""
    hf_config = hf_config_from_model(config, torch_dtype=dtype, token_ids=token_ids)
    write_files(directory, hf_config, tensors_of(params, tensor_rules(config), dtype), max_shard_bytes=max_shard_bytes)
