"""The Mamba2 safetensors format: ``transformers``' own ``Mamba2ForCausalLM`` (no remote code), read into and
written from the project's Mamba2 LM.

The config. A Mamba2 run in the reference layout is exactly ``Mamba2ForCausalLM``: every layer ``mamba2``,
no MLP (``model.mlp: false``), the gated norm over all heads (``model.mamba2.gated_norm: after_gate``, the
reference ``RMSNormGated(norm_before_gate=False)`` with one group), one group of B and C:

    hidden_size -> d_model      num_heads -> num_heads (and mamba2.head_dim, so heads = expand d_model / head_dim)
    head_dim -> mamba2.head_dim     state_size -> mamba2.state_dim     expand -> mamba2.expand
    conv_kernel -> mamba2.conv_kernel      layer_norm_epsilon -> norm_eps      num_hidden_layers -> mixers
    tie_word_embeddings -> tie_embeddings      vocab_size      n_groups = 1, use_bias = false, use_conv_bias = true

A field the project does not implement (several groups, projection biases, a convolution without bias, an
activation other than silu, a clamp of the time step, no gated norm) is refused by name. The time-step
initialisation fields (``time_step_min`` / ``max`` / ``floor``) only shape a fresh model and are not read.

The tensors, per layer ``i`` (``backbone.layers.{i}.`` in Hugging Face, ``blocks/{i}/`` here)::

    mixer.in_proj.weight [2 H P + 2 N + H, D]  rows: gate | x_proj [D, H, P] | b_proj | c_proj [D, N] | dt_proj [D, H]
    mixer.conv1d.weight  [H P + 2 N, 1, K]     channels: x_conv | b_conv | c_conv   (each [K, C] -> [C, 1, K], flipped)
    mixer.conv1d.bias    [H P + 2 N]          = x_conv | b_conv | c_conv biases
    mixer.dt_bias, mixer.A_log, mixer.D [H]   = dt_bias, a_log, skip
    mixer.norm.weight [H P] = norm/scale;   mixer.out_proj.weight [D, H P] = out/kernel [H, P, D] reshaped, transposed
    norm.weight = mixer_norm/scale

and ``backbone.embeddings.weight -> embed``, ``backbone.norm_f.weight -> final_norm/scale``, ``lm_head.weight
[V, D] -> head [D, V]`` (absent with tied embeddings). Every map is a transpose, reshape, flip or
concatenation, so an export loads back bitwise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.errors import HFFormatError
from seqmodels.hf.directory import write_json
from seqmodels.hf.safetensors_io import write_checkpoint
from seqmodels.hf.tensor_rules import JoinedRule, TensorRule, fill_params, tensors_of
from seqmodels.models import abstract_model

MODEL_TYPES = ("mamba2",)
ARCHITECTURE = "Mamba2ForCausalLM"
# (field, the only accepted value): what the project's Mamba2 is; a checkpoint with another value is refused
REFUSED = (("n_groups", 1), ("use_bias", False), ("use_conv_bias", True), ("hidden_act", "silu"),
           ("rms_norm", True))


def _same(x):
    return x


def _field(hf: dict, name: str, source: str):
    if hf.get(name) is None:
        raise HFFormatError(f"{source}: field {name!r} is missing")
    return hf[name]


def check_exportable(model: ModelConfig) -> None:
    """Raise ``HFFormatError`` unless ``model`` is a Mamba2 LM in the layout ``Mamba2ForCausalLM`` holds."""
    if model.kind != "lm":
        raise HFFormatError(f"model.kind {model.kind!r}: only the decoder LM is a Mamba2ForCausalLM")
    for index, name in enumerate(model.mixers):
        if name != "mamba2":
            raise HFFormatError(f"layer {index} is mixer {name!r}: only every layer 'mamba2' is a Mamba2ForCausalLM")
    settings = {"model.mlp": (model.mlp, False), "model.mamba2.gated_norm": (model.mamba2.gated_norm, "after_gate")}
    for key, (value, needed) in settings.items():
        if value != needed:
            raise HFFormatError(f"{key} = {value!r} has no Mamba2ForCausalLM equivalent (export needs {needed!r})")


def _heads(model: ModelConfig) -> tuple[int, int, int]:
    """``(heads H, head_dim P, inner H P)`` as the mixer derives them."""
    inner = model.mamba2.expand * model.d_model
    head_dim = model.mamba2.head_dim or inner // model.num_heads
    return inner // head_dim, head_dim, inner


def hf_config_from_model(model: ModelConfig, *, torch_dtype: str, token_ids: dict | None = None) -> dict:
    """The ``config.json`` dict of ``model`` (a ``Mamba2ForCausalLM``); special ids only where given (the
    transformers defaults of 0 / 1 / 2 are not this model's)."""
    check_exportable(model)
    heads, head_dim, _ = _heads(model)
    hf = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPES[0], "vocab_size": model.vocab_size,
          "hidden_size": model.d_model, "num_hidden_layers": len(model.mixers), "num_heads": heads,
          "head_dim": head_dim, "state_size": model.mamba2.state_dim, "expand": model.mamba2.expand,
          "conv_kernel": model.mamba2.conv_kernel, "n_groups": 1, "use_bias": False, "use_conv_bias": True,
          "hidden_act": "silu", "rms_norm": True, "residual_in_fp32": True, "layer_norm_epsilon": model.norm_eps,
          "chunk_size": model.mamba2.chunk_size, "tie_word_embeddings": model.tie_embeddings,
          "initializer_range": model.init_std, "use_cache": True, "torch_dtype": torch_dtype, "dtype": torch_dtype,
          "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    hf.update({key: value for key, value in (token_ids or {}).items() if value is not None})
    return hf


def model_config_from_hf(hf: dict, source: str = "config.json", base: ModelConfig | None = None) -> ModelConfig:
    """The ``ModelConfig`` of the ``Mamba2ForCausalLM`` ``config.json`` dict ``hf`` (``base``: the settings that are
    not the architecture)."""
    names = hf.get("architectures")
    if names not in (None, [ARCHITECTURE]):
        raise HFFormatError(f"{source}: architectures {names!r}: model_type 'mamba2' is read as {ARCHITECTURE}")
    for field, accepted in REFUSED:
        if hf.get(field, accepted) != accepted:
            raise HFFormatError(f"{source}: {field} = {hf[field]!r} is not implemented (only {accepted!r})")
    limit = hf.get("time_step_limit")
    if limit is not None and (float(limit[0]) != 0.0 or float(limit[1]) != float("inf")):
        raise HFFormatError(f"{source}: time_step_limit {limit!r} is not implemented (no clamp: [0, inf])")
    d_model, heads = int(_field(hf, "hidden_size", source)), int(_field(hf, "num_heads", source))
    base = base or ModelConfig()
    mamba2 = dataclasses.replace(base.mamba2, state_dim=int(_field(hf, "state_size", source)),
                                 expand=int(hf.get("expand", 2)), head_dim=int(_field(hf, "head_dim", source)),
                                 conv_kernel=int(hf.get("conv_kernel", 4)), gated_norm="after_gate",
                                 chunk_size=int(hf.get("chunk_size") or base.mamba2.chunk_size))
    try:
        config = dataclasses.replace(
            base, kind="lm", vocab_size=int(_field(hf, "vocab_size", source)), d_model=d_model, num_heads=heads,
            mixers=("mamba2",) * int(_field(hf, "num_hidden_layers", source)), mlp=False,
            norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), tie_embeddings=bool(hf.get("tie_word_embeddings")),
            mamba2=mamba2)
    except ConfigError as error:
        raise HFFormatError(f"{source}: describes a model the project cannot build: {error}") from None
    if _heads(config)[0] * mamba2.head_dim != mamba2.expand * d_model:
        raise HFFormatError(f"{source}: num_heads {heads} x head_dim {mamba2.head_dim} must be expand x hidden_size "
                            f"({mamba2.expand} x {d_model})")
    return config


def _dense_in():
    """``W [prod(out), D]`` <-> ``kernel [D, *out]`` (the piece's ``out`` shape is the template's)."""
    return lambda shape: (lambda w: w.T.reshape(shape), lambda k: k.reshape(k.shape[0], -1).T)


def _conv_weight():
    return lambda shape: (lambda t: t[:, 0, ::-1].T, lambda w: w.T[:, None, ::-1])


def _layer_rules(layer: int, config: ModelConfig) -> list:
    heads, head_dim, inner = _heads(config)
    state, width = config.mamba2.state_dim, config.d_model
    hf, ours = f"backbone.layers.{layer}.", ("blocks", layer, "mixer")

    def part(name: str, path: tuple, shape: tuple, layout) -> TensorRule:
        to_project, to_hf = layout(shape)
        return TensorRule(hf + name, ours + path, to_project, to_hf)

    projections = [("gate", (width, heads, head_dim)), ("x_proj", (width, heads, head_dim)),
                   ("b_proj", (width, state)), ("c_proj", (width, state)), ("dt_proj", (width, heads))]
    convs = [("x_conv", inner), ("b_conv", state), ("c_conv", state)]
    kernel = config.mamba2.conv_kernel
    return [
        JoinedRule(hf + "mixer.in_proj.weight", tuple(part(f"mixer.in_proj.weight[{name}]", (name, "kernel"), shape,
                                                           _dense_in()) for name, shape in projections)),
        JoinedRule(hf + "mixer.conv1d.weight", tuple(part(f"mixer.conv1d.weight[{name}]", (name, "weight"),
                                                          (kernel, channels), _conv_weight())
                                                     for name, channels in convs)),
        JoinedRule(hf + "mixer.conv1d.bias", tuple(TensorRule(hf + f"mixer.conv1d.bias[{name}]", ours + (name, "bias"),
                                                              _same, _same) for name, _ in convs)),
        TensorRule(hf + "mixer.dt_bias", ours + ("dt_bias",), _same, _same),
        TensorRule(hf + "mixer.A_log", ours + ("a_log",), _same, _same),
        TensorRule(hf + "mixer.D", ours + ("skip",), _same, _same),
        TensorRule(hf + "mixer.norm.weight", ours + ("norm", "scale"), _same, _same),
        TensorRule(hf + "mixer.out_proj.weight", ours + ("out", "kernel"),
                   lambda w: w.T.reshape(heads, head_dim, width), lambda k: k.reshape(inner, width).T),
        TensorRule(hf + "norm.weight", ("blocks", layer, "mixer_norm", "scale"), _same, _same),
    ]


def tensor_rules(config: ModelConfig) -> list:
    """Every tensor of the ``Mamba2ForCausalLM`` checkpoint of ``config``."""
    rules = [TensorRule("backbone.embeddings.weight", ("embed",), _same, _same)]
    for layer in range(len(config.mixers)):
        rules += _layer_rules(layer, config)
    rules.append(TensorRule("backbone.norm_f.weight", ("final_norm", "scale"), _same, _same))
    if not config.tie_embeddings:
        rules.append(TensorRule("lm_head.weight", ("head",), lambda w: w.T, lambda h: h.T))
    return rules


def read_config(hf: dict, source: str, base: ModelConfig | None = None) -> ModelConfig:
    return model_config_from_hf(hf, source, base)


def read_params(directory: Path, config: ModelConfig) -> dict:
    """The float32 parameter dict of the ``Mamba2ForCausalLM`` checkpoint in ``directory`` for ``config``."""
    _, abstract_state = abstract_model(config)

    def tied_copy(name: str) -> bool:  # a tied head's copy that a checkpoint may hold
        return config.tie_embeddings and name == "lm_head.weight"

    return fill_params(directory, tensor_rules(config), nnx.to_pure_dict(abstract_state), tied_copy)


def write(directory: Path, config: ModelConfig, params: dict, *, dtype: str, token_ids: dict,
          max_shard_bytes: int) -> None:
    """Write the checkpoint and ``config.json`` of ``config`` with ``params`` into the new directory."""
    hf_config = hf_config_from_model(config, torch_dtype=dtype, token_ids=token_ids)
    write_checkpoint(directory, tensors_of(params, tensor_rules(config), dtype), max_shard_bytes=max_shard_bytes)
    write_json(directory / "config.json", hf_config)
