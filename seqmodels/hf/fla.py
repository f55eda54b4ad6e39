"""The flash-linear-attention format: fla's ``GatedDeltaNetForCausalLM`` (``model_type: gated_deltanet``) and
``DeltaNetForCausalLM`` (``delta_net``), read into and written from the project's DeltaNet LMs.

Term by term the two layers are one computation (``seqmodels.mixers.deltanet``; fla's
``fla.layers.gated_deltanet.GatedDeltaNet``, ``fla.layers.delta_net.DeltaNet``): bias-free q/k/v projections,
each through a depthwise causal convolution and SiLU; q, k L2-normalised per head (eps 1e-6); beta =
sigmoid(W_b x); the gate -exp(A_log) softplus(W_a x + dt_bias) (gated only); the delta rule with q scaled by
K^-1/2; a per-head RMSNorm over V (eps ``norm_eps``, one weight shared by the heads) times SiLU(W_g x); a
bias-free output projection. The block is pre-norm with a SwiGLU MLP (fla's ``GatedMLP``, ``hidden_act:
swish``), the final RMSNorm and the head (tied or not) are the same; every norm takes ``norm_eps``.

One term differs: the project's short convolutions carry a bias (``seqmodels.layers.conv.ShortConv``, trained),
fla's model builds its ``ShortConvolution`` without one (``conv_bias`` is no field of either config). A model
is written in this format only when every q/k/v convolution bias is exactly zero (``check_params``), so the
export is exact; reading an fla checkpoint sets those biases to zero. The format is written on request only
(``export.py --format fla``; ``seqmodels.hf.formats.ON_REQUEST``).

The config: every layer ``gated_deltanet`` (or every layer ``deltanet``), ``model.mlp`` on, heads H, key width
K, value width V per head (``seqmodels.mixers.deltanet.deltanet_shape``)::

    gated_deltanet: num_heads = H, head_dim = K, expand_v = V / K       (fla: head_v_dim = int(K expand_v))
    delta_net:      num_heads = H, expand_k = H K / D, expand_v = H V / D, use_gate = true
    both:           hidden_size = D, conv_size = deltanet.conv_kernel, intermediate_size = mlp_hidden,
                    norm_eps, num_hidden_layers, vocab_size, tie_word_embeddings, max_position_embeddings

Fields that would change the computation (no output gate, no convolution, negative eigenvalues, grouped
value heads, a sigmoid output gate, attention layers, ``attnres``, another q/k activation or norm) are
refused by name when read.

The tensors, per layer ``i`` (``model.layers.{i}.`` in fla, ``blocks/{i}/`` here)::

    attn.{q,k,v}_proj.weight [H K | H V, D] = mixer/{query,key,value}/kernel [D, H, K | V] reshaped, transposed
    attn.{q,k,v}_conv1d.weight [C, 1, W]    = mixer/{q,k,v}_conv/weight [W, C] transposed and flipped
    attn.b_proj.weight [H, D] = mixer/beta_proj/kernel;     attn.g_proj.weight [H V, D] = mixer/gate/kernel
    attn.a_proj.weight [H, D] = mixer/decay_proj/kernel;    attn.A_log, attn.dt_bias [H] = mixer/a_log, dt_bias
    attn.o_norm.weight [V] = mixer/norm/scale;   attn.o_proj.weight [D, H V] = mixer/out/kernel [H, V, D]
    attn_norm.weight, mlp_norm.weight = mixer_norm/scale, mlp_norm/scale
    mlp.{gate,up,down}_proj.weight = mlp/{gate,up,down}/kernel transposed

(``a_proj``, ``A_log``, ``dt_bias``: gated only), and ``model.embeddings.weight -> embed``,
``model.norm.weight -> final_norm/scale``, ``lm_head.weight [V, D] -> head [D, V]`` (absent when tied). Every map
is a transpose, reshape or flip, so an export loads back bitwise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.errors import HFFormatError
from seqmodels.hf.directory import write_json
from seqmodels.hf.safetensors_io import write_checkpoint
from seqmodels.hf.tensor_rules import TensorRule, fill_params, get_path, set_path, tensors_of
from seqmodels.mixers.deltanet import deltanet_shape
from seqmodels.models import abstract_model

MODEL_TYPES = ("gated_deltanet", "delta_net")
MIXER_OF = {"gated_deltanet": "gated_deltanet", "delta_net": "deltanet"}  # fla model_type -> the project's mixer
MODEL_TYPE_OF = {mixer: model_type for model_type, mixer in MIXER_OF.items()}
ARCHITECTURES = {"gated_deltanet": "GatedDeltaNetForCausalLM", "delta_net": "DeltaNetForCausalLM"}
CONVOLUTIONS = ("q_conv", "k_conv", "v_conv")
# (field, the values that are the project's layer): a checkpoint with another value is refused
SHARED_FIELDS = (("use_gate", (True,)), ("use_short_conv", (True,)), ("allow_neg_eigval", (False,)),
                 ("hidden_act", ("swish",)), ("attn", (None,)), ("attnres_block_size", (None,)))
FIELDS = {"gated_deltanet": SHARED_FIELDS + (("output_gate_activation", ("swish", "silu")),),
          "delta_net": SHARED_FIELDS + (("use_beta", (True,)), ("use_output_norm", (True,)), ("qk_norm", ("l2",)),
                                        ("qk_activation", ("silu",)))}


def _same(x):
    return x


def _field(hf: dict, name: str, source: str):
    if hf.get(name) is None:
        raise HFFormatError(f"{source}: field {name!r} is missing")
    return hf[name]


def check_exportable(model: ModelConfig) -> None:
    """Raise ``HFFormatError`` unless ``model`` is a DeltaNet LM in the layout fla's model holds (module docstring)."""
    if model.kind != "lm":
        raise HFFormatError(f"model.kind {model.kind!r}: only the decoder LM is an fla DeltaNet model")
    mixers = set(model.mixers)
    if len(mixers) != 1 or not mixers <= set(MODEL_TYPE_OF):
        index, name = next((i, name) for i, name in enumerate(model.mixers)
                           if name not in MODEL_TYPE_OF or name != model.mixers[0])
        raise HFFormatError(f"layer {index} is mixer {name!r}: only every layer 'gated_deltanet' (or every layer "
                            "'deltanet') is an fla GatedDeltaNetForCausalLM (DeltaNetForCausalLM)")
    if not model.mlp:
        raise HFFormatError("model.mlp = False has no fla equivalent (every fla block has its GatedMLP; export needs "
                            "True)")
    heads, key_dim, value_dim = deltanet_shape(model)
    if model.mixers[0] == "gated_deltanet" and int(key_dim * (value_dim / key_dim)) != value_dim:
        raise HFFormatError(f"model.deltanet.value_head_dim = {value_dim}: fla's head_v_dim int(head_dim * expand_v) "
                            f"with head_dim {key_dim} does not give it back")
    if model.mixers[0] == "deltanet":
        for name, width in (("key", heads * key_dim), ("value", heads * value_dim)):
            if round(model.d_model * (width / model.d_model)) != width:
                raise HFFormatError(f"the {name} width {width} is not d_model {model.d_model} times a float that "
                                    "fla's DeltaNet rounds back to it")


def check_params(config: ModelConfig, params: dict) -> None:
    """Raise ``HFFormatError`` unless every q/k/v convolution bias of ``params`` is exactly zero (fla's
    ``ShortConvolution`` has none)."""
    for layer in range(len(config.mixers)):
        for conv in CONVOLUTIONS:
            bias = np.asarray(get_path(params, ("blocks", layer, "mixer", conv, "bias")), np.float32)
            if np.any(bias != 0):
                raise HFFormatError(
                    f"layer {layer}: mixer.{conv}.bias is not zero (max |bias| {float(np.abs(bias).max()):.3g}); "
                    "fla's ShortConvolution has no bias, so this model has no exact fla layout; export it in the "
                    "default format (model_type seqmodels)")


def _model_type(model: ModelConfig) -> str:
    return MODEL_TYPE_OF[model.mixers[0]]


def hf_config_from_model(model: ModelConfig, *, torch_dtype: str, token_ids: dict | None = None) -> dict:
    """The ``config.json`` dict of ``model`` (fla's config fields); special ids only where given."""
    check_exportable(model)
    model_type = _model_type(model)
    heads, key_dim, value_dim = deltanet_shape(model)
    hf = {"architectures": [ARCHITECTURES[model_type]], "model_type": model_type, "attn_mode": "chunk",
          "hidden_size": model.d_model, "num_heads": heads, "use_gate": True, "use_short_conv": True,
          "allow_neg_eigval": False, "conv_size": model.deltanet.conv_kernel,
          "max_position_embeddings": model.max_seq_len, "hidden_ratio": 4, "intermediate_size": model.mlp_hidden,
          "hidden_act": "swish", "num_hidden_layers": len(model.mixers), "norm_eps": model.norm_eps, "attn": None,
          "use_cache": True, "tie_word_embeddings": model.tie_embeddings, "initializer_range": model.init_std,
          "fuse_norm": True, "fuse_swiglu": True, "fuse_cross_entropy": True, "fuse_linear_cross_entropy": False,
          "use_l2warp": False, "vocab_size": model.vocab_size, "attnres_block_size": None,
          "torch_dtype": torch_dtype, "dtype": torch_dtype, "bos_token_id": None, "eos_token_id": None,
          "pad_token_id": None}
    if model_type == "gated_deltanet":
        hf.update(head_dim=key_dim, expand_v=value_dim / key_dim, num_v_heads=None, output_gate_activation="swish")
    else:
        hf.update(expand_k=heads * key_dim / model.d_model, expand_v=heads * value_dim / model.d_model,
                  use_beta=True, use_output_norm=True, qk_norm="l2", qk_activation="silu")
    hf.update({key: value for key, value in (token_ids or {}).items() if value is not None})
    return hf


def _check_fields(hf: dict, model_type: str, source: str) -> None:
    for field, accepted in FIELDS[model_type]:
        if hf.get(field, accepted[0]) not in accepted:
            raise HFFormatError(f"{source}: {field} = {hf[field]!r} is not implemented (only "
                                f"{' or '.join(map(repr, accepted))})")
    heads = hf.get("num_heads")
    if hf.get("num_v_heads") not in (None, heads):
        raise HFFormatError(f"{source}: num_v_heads = {hf['num_v_heads']!r} (grouped value heads) is not implemented "
                            f"(only num_heads, {heads!r})")


def _mlp_width(hf: dict, width: int) -> int:
    """fla's ``GatedMLP`` width: ``intermediate_size``, else 2/3 ``hidden_ratio`` D rounded up to a multiple of 256."""
    if hf.get("intermediate_size"):
        return int(hf["intermediate_size"])
    hidden = int(width * (hf.get("hidden_ratio") or 4) * 2 / 3)
    return 256 * ((hidden + 255) // 256)


def _head_dims(hf: dict, model_type: str, width: int, heads: int, source: str) -> tuple[int, int]:
    """``(K, V)`` per head as fla's layer derives them from the config."""
    if model_type == "gated_deltanet":
        key_dim = int(_field(hf, "head_dim", source))
        return key_dim, int(key_dim * float(hf.get("expand_v", 2.0)))
    key_total, value_total = (round(width * float(hf.get(name, 1.0))) for name in ("expand_k", "expand_v"))
    if key_total % heads or value_total % heads:
        raise HFFormatError(f"{source}: key width {key_total} and value width {value_total} must divide by "
                            f"num_heads {heads}")
    return key_total // heads, value_total // heads


def model_config_from_hf(hf: dict, source: str = "config.json", base: ModelConfig | None = None) -> ModelConfig:
    """The ``ModelConfig`` of fla's ``config.json`` dict ``hf`` (``base``: the settings that are not the
    architecture)."""
    model_type = hf.get("model_type")
    names = hf.get("architectures")
    if model_type not in MODEL_TYPES or names not in (None, [ARCHITECTURES[model_type]]):
        raise HFFormatError(f"{source}: model_type {model_type!r} with architectures {names!r} is not one of fla's "
                            f"{', '.join(f'{t} ({ARCHITECTURES[t]})' for t in MODEL_TYPES)}")
    _check_fields(hf, model_type, source)
    width, heads = int(_field(hf, "hidden_size", source)), int(_field(hf, "num_heads", source))
    key_dim, value_dim = _head_dims(hf, model_type, width, heads, source)
    base = base or ModelConfig()
    deltanet = dataclasses.replace(base.deltanet, head_dim=key_dim, value_head_dim=value_dim,
                                   conv_kernel=int(hf.get("conv_size", 4)))
    try:
        return dataclasses.replace(
            base, kind="lm", vocab_size=int(_field(hf, "vocab_size", source)), d_model=width, num_heads=heads,
            mixers=(MIXER_OF[model_type],) * int(_field(hf, "num_hidden_layers", source)), mlp=True,
            d_ff=_mlp_width(hf, width), norm_eps=float(hf.get("norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_seq_len=int(hf.get("max_position_embeddings") or base.max_seq_len), deltanet=deltanet)
    except ConfigError as error:
        raise HFFormatError(f"{source}: describes a model the project cannot build: {error}") from None


def _dense_in(shape: tuple):
    """``W [prod(out), D]`` <-> ``kernel [D, *out]``."""
    return lambda w: w.T.reshape(shape), lambda k: k.reshape(k.shape[0], -1).T


def _conv_weight():
    """``weight [C, 1, W]`` (time-major) <-> ``[W, C]`` (lag-major)."""
    return lambda t: t[:, 0, ::-1].T, lambda w: w.T[:, None, ::-1]


def _transpose():
    return lambda w: w.T, lambda k: k.T


def _layer_rules(layer: int, config: ModelConfig) -> list[TensorRule]:
    heads, key_dim, value_dim = deltanet_shape(config)
    width = config.d_model
    hf, ours = f"model.layers.{layer}.", ("blocks", layer)
    maps = {
        "attn.q_proj.weight": (("mixer", "query", "kernel"), _dense_in((width, heads, key_dim))),
        "attn.k_proj.weight": (("mixer", "key", "kernel"), _dense_in((width, heads, key_dim))),
        "attn.v_proj.weight": (("mixer", "value", "kernel"), _dense_in((width, heads, value_dim))),
        "attn.b_proj.weight": (("mixer", "beta_proj", "kernel"), _transpose()),
        "attn.g_proj.weight": (("mixer", "gate", "kernel"), _dense_in((width, heads, value_dim))),
        "attn.q_conv1d.weight": (("mixer", "q_conv", "weight"), _conv_weight()),
        "attn.k_conv1d.weight": (("mixer", "k_conv", "weight"), _conv_weight()),
        "attn.v_conv1d.weight": (("mixer", "v_conv", "weight"), _conv_weight()),
        "attn.o_norm.weight": (("mixer", "norm", "scale"), (_same, _same)),
        "attn.o_proj.weight": (("mixer", "out", "kernel"),
                               (lambda w: w.T.reshape(heads, value_dim, width),
                                lambda k: k.reshape(heads * value_dim, width).T)),
        "attn_norm.weight": (("mixer_norm", "scale"), (_same, _same)),
        "mlp_norm.weight": (("mlp_norm", "scale"), (_same, _same)),
        "mlp.gate_proj.weight": (("mlp", "gate", "kernel"), _transpose()),
        "mlp.up_proj.weight": (("mlp", "up", "kernel"), _transpose()),
        "mlp.down_proj.weight": (("mlp", "down", "kernel"), _transpose()),
    }
    if config.mixers[layer] == "gated_deltanet":
        maps.update({"attn.a_proj.weight": (("mixer", "decay_proj", "kernel"), _transpose()),
                     "attn.A_log": (("mixer", "a_log"), (_same, _same)),
                     "attn.dt_bias": (("mixer", "dt_bias"), (_same, _same))})
    return [TensorRule(hf + name, ours + path, *layout) for name, (path, layout) in maps.items()]


def tensor_rules(config: ModelConfig) -> list[TensorRule]:
    """Every tensor of fla's checkpoint of ``config``."""
    rules = [TensorRule("model.embeddings.weight", ("embed",), _same, _same)]
    for layer in range(len(config.mixers)):
        rules += _layer_rules(layer, config)
    rules.append(TensorRule("model.norm.weight", ("final_norm", "scale"), _same, _same))
    if not config.tie_embeddings:
        rules.append(TensorRule("lm_head.weight", ("head",), *_transpose()))
    return rules


def read_config(hf: dict, source: str, base: ModelConfig | None = None) -> ModelConfig:
    return model_config_from_hf(hf, source, base)


def read_params(directory: Path, config: ModelConfig) -> dict:
    """The float32 parameter dict of fla's checkpoint in ``directory`` for ``config`` (convolution biases zero)."""
    _, abstract_state = abstract_model(config)

    def tied_copy(name: str) -> bool:  # a tied head's copy that a checkpoint may hold
        return config.tie_embeddings and name == "lm_head.weight"

    params = fill_params(directory, tensor_rules(config), nnx.to_pure_dict(abstract_state), tied_copy)
    for layer in range(len(config.mixers)):
        for conv in CONVOLUTIONS:
            path = ("blocks", layer, "mixer", conv, "bias")
            set_path(params, path, jnp.zeros(get_path(params, path).shape, jnp.float32))
    return params


def write(directory: Path, config: ModelConfig, params: dict, *, dtype: str, token_ids: dict,
          max_shard_bytes: int) -> None:
    """Write the checkpoint and ``config.json`` of ``config`` with ``params`` into the new directory."""
    hf_config = hf_config_from_model(config, torch_dtype=dtype, token_ids=token_ids)
    check_params(config, params)
    write_checkpoint(directory, tensors_of(params, tensor_rules(config), dtype), max_shard_bytes=max_shard_bytes)
    write_json(directory / "config.json", hf_config)
