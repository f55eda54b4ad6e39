"""The ``model_type: seqmodels`` format: any architecture as a Hugging Face directory with its own PyTorch modules.

A directory of this format holds

- ``config.json``: ``model_type: seqmodels``, the resolved ``model`` section (``scan_layers`` off: the
  weights are per layer; ``init_from`` empty: the weights are in the directory), ``architectures`` and
  ``auto_map`` (the kind's export class, ``seqmodels.models.kinds``: ``SeqmodelsForCausalLM`` for the
  decoder LM and AHN, ``SeqmodelsLoopedForSequenceClassification`` with ``id2label`` for the looped
  model), ``torch_dtype``;
- ``model.safetensors`` (shards and an index above 2 GB) in the PyTorch layouts below;
- the files of ``seqmodels/hf/torch/`` and the plain-Python modules of constants they share with JAX
  (``seqmodels.hf.torch.exported_files``), which ``transformers`` runs with ``trust_remote_code=True``.

Tensor layout: one rule per parameter of the (unscanned) model, decided by the layer that owns it, so
every mixer (and a future one made of the same layers) maps without a table of its own. The PyTorch
name is ``model.`` + the JAX path joined by dots, with the layer's own leaf names:

    Dense     kernel [in, *out] -> <path>.weight [prod(out), in]  = kernel.reshape(in, -1).T   (nn.Linear)
              bias   [*out]     -> <path>.bias   [prod(out)]
    DenseOut  kernel [*in, out] -> <path>.weight [out, prod(in)]  = kernel.reshape(-1, out).T
    ShortConv weight [K, C]     -> <path>.weight [C, 1, K]        = weight.T[:, None, ::-1]    (depthwise conv1d)
              bias   [C]        -> <path>.bias
    RMSNorm   scale  [C]        -> <path>.weight
    embed [V, D] -> model.embed.weight (nn.Embedding);  head [D, V] -> lm_head.weight [V, D] = head.T

and every other parameter (decays, skips, initial memories, the pad embedding) keeps its name and
layout. Each map is a transpose, reshape or flip: a bijection, so reading a float32 export back gives
its parameters bitwise. A new layer type with parameters of its own adds its entry to ``LAYER_LEAVES``.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.hf.directory import write_json
from seqmodels.errors import HFFormatError
from seqmodels.hf.safetensors_io import write_checkpoint
from seqmodels.hf.tensor_rules import TensorRule, fill_params, tensors_of
from seqmodels.layers.common import Dense, DenseOut
from seqmodels.layers.conv import ShortConv
from seqmodels.layers.norms import RMSNorm
from seqmodels.models import build_model, model_kind

MODEL_TYPES = ("seqmodels",)
# What a reader's ``base`` sets over a directory's model section: how the model runs, not what it is.
RUN_SETTINGS = ("compute_dtype", "kernel_impl", "remat", "attention.implementation")


def _same(x):
    return x


def _dense_kernel(shape):
    return lambda k: k.reshape(k.shape[0], -1).T, lambda w: w.T.reshape(shape)


def _dense_out_kernel(shape):
    return lambda k: k.reshape(-1, k.shape[-1]).T, lambda w: w.T.reshape(shape)


def _flat(shape):
    return lambda b: b.reshape(-1), lambda b: b.reshape(shape)


def _conv_weight(shape):
    return lambda w: w.T[:, None, ::-1], lambda t: t[:, 0, ::-1].T


# owning layer -> {JAX leaf name: (PyTorch leaf name, layout maker(shape) -> (to_torch, to_jax))}
LAYER_LEAVES = {
    Dense: {"kernel": ("weight", _dense_kernel), "bias": ("bias", _flat)},
    DenseOut: {"kernel": ("weight", _dense_out_kernel)},
    ShortConv: {"weight": ("weight", _conv_weight), "bias": ("bias", lambda shape: (_same, _same))},
    RMSNorm: {"scale": ("weight", lambda shape: (_same, _same))},
}
TOP_LEVEL = {("embed",): ("model.embed.weight", lambda shape: (_same, _same)),
             ("head",): ("lm_head.weight", lambda shape: (lambda h: h.T, lambda w: w.T))}


def abstract_unscanned_model(config: ModelConfig) -> nnx.Module:
    """The model of ``config`` with one module per layer (``scan_layers`` off), shapes only."""
    return nnx.eval_shape(lambda: build_model(dataclasses.replace(config, scan_layers=False)))


def _rule(path: tuple, shape: tuple, owner) -> TensorRule:
    if path in TOP_LEVEL:
        name, layout = TOP_LEVEL[path]
        return TensorRule(name, path, *reversed(layout(shape)))
    leaves = LAYER_LEAVES.get(type(owner), {})
    leaf, layout = leaves.get(path[-1], (str(path[-1]), lambda shape: (_same, _same)))
    to_torch, to_jax = layout(shape)
    return TensorRule(".".join(["model", *map(str, path[:-1]), leaf]), path, to_jax, to_torch)


def torch_tensor_rules(config: ModelConfig) -> list[TensorRule]:
    """One rule per parameter of ``config``'s model (unscanned layout): ``hf_name`` is the PyTorch name,
    ``to_hf`` maps a JAX array to the PyTorch layout and ``to_project`` back."""
    model = abstract_unscanned_model(config)
    owners = {tuple(path): node for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Module)}
    rules = []
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        path = tuple(path)
        rules.append(_rule(path, tuple(variable.get_value().shape), owners.get(path[:-1])))
    names = [rule.hf_name for rule in rules]
    if len(set(names)) != len(names):
        raise ValueError(f"two parameters map to one PyTorch name: {sorted(n for n in names if names.count(n) > 1)}")
    return rules


def check_exportable(config: ModelConfig) -> None:
    """``HFFormatError`` unless every mixer of ``config`` has a PyTorch twin (``seqmodels.hf.torch.mixers``) that
    runs its settings (not ``model.atlas.ns_granularity=chunk``)."""
    from seqmodels.hf.torch.mixers import MIXERS
    for name in config.mixers_in_use:
        if name not in MIXERS:
            raise HFFormatError(f"mixer {name!r} has no PyTorch module in seqmodels/hf/torch; exported mixers: "
                                f"{', '.join(sorted(MIXERS))}")
    from seqmodels.mixers.registry import sections_used_by
    if "atlas" in sections_used_by(config.mixers_in_use) and config.atlas.ns_granularity != "token":
        raise HFFormatError(f"model.atlas.ns_granularity={config.atlas.ns_granularity!r} has no PyTorch form: "
                            "seqmodels/hf/torch/atlas.py runs the token rule (Newton-Schulz of every token's "
                            "momentum) only; export a model trained with model.atlas.ns_granularity=token")


def hf_config_from_model(config: ModelConfig, *, torch_dtype: str, token_ids: dict | None = None) -> dict:
    """The ``config.json`` dict of an export of ``config`` (module docstring)."""
    from seqmodels.config_io import to_dict
    model = to_dict(dataclasses.replace(config, scan_layers=False, init_from=""))  # the weights are here
    export = model_kind(config).export
    hf = {"architectures": [export.architecture], "model_type": MODEL_TYPES[0],
          "auto_map": {"AutoConfig": "configuration_seqmodels.SeqmodelsConfig",
                       export.auto_class: f"modeling_seqmodels.{export.architecture}"},
          "model": model, "torch_dtype": torch_dtype, "dtype": torch_dtype, "use_cache": True}
    if export.labels:
        hf.update(id2label={str(k): v for k, v in enumerate(export.labels)},
                  label2id={v: k for k, v in enumerate(export.labels)})
    hf.update({key: value for key, value in (token_ids or {}).items() if value is not None})
    return hf


def write(directory: Path, config: ModelConfig, params: dict, *, dtype: str, token_ids: dict,
          max_shard_bytes: int) -> None:
    """Write the export's files (module docstring) into the (new, empty) ``directory``."""
    from seqmodels.hf.torch import exported_files
    check_exportable(config)
    write_checkpoint(directory, tensors_of(params, torch_tensor_rules(config), dtype), max_shard_bytes=max_shard_bytes)
    hf_config = hf_config_from_model(config, torch_dtype=dtype, token_ids=token_ids)
    write_json(directory / "config.json", hf_config)
    for name, source in exported_files().items():
        shutil.copyfile(source, directory / name)


def with_run_settings(config: ModelConfig, base: ModelConfig) -> ModelConfig:
    """``config`` with ``base``'s ``RUN_SETTINGS`` (the architecture stays ``config``'s)."""
    attention = dataclasses.replace(config.attention, implementation=base.attention.implementation)
    return dataclasses.replace(config, compute_dtype=base.compute_dtype, kernel_impl=base.kernel_impl,
                               remat=base.remat, attention=attention)


def read_config(hf: dict, source: str, base: ModelConfig | None = None) -> ModelConfig:
    """The ``ModelConfig`` of a seqmodels export's ``config.json`` dict ``hf`` (``base``'s ``RUN_SETTINGS``)."""
    from seqmodels.config_io import model_config_from_dict
    if not isinstance(hf.get("model"), dict):
        raise HFFormatError(f"{source}: model_type 'seqmodels' needs the 'model' section (a dict), got "
                            f"{type(hf.get('model')).__name__}")
    try:
        config = model_config_from_dict(hf["model"])
    except ConfigError as error:
        raise HFFormatError(f"{source}: its 'model' section is not a valid model config: {error}") from None
    return config if base is None else with_run_settings(config, base)


def read_params(directory: Path, config: ModelConfig) -> dict:
    """The float32 parameter dict (unscanned layout) of the seqmodels export in ``directory``."""
    config = dataclasses.replace(config, scan_layers=False)
    template = nnx.to_pure_dict(nnx.state(abstract_unscanned_model(config), nnx.Param))
    return fill_params(directory, torch_tensor_rules(config), template)
