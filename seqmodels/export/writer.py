"""Any architecture -> a ``model_type: seqmodels`` Hugging Face directory with its own PyTorch modules.

``export_seqmodels`` writes

- ``config.json``: ``model_type: seqmodels``, the resolved ``model`` section (``scan_layers`` off: the
  weights are per layer; ``init_from`` empty: the weights are in the directory), ``architectures`` and ``auto_map`` (``SeqmodelsForCausalLM`` for the decoder LM,
  ``SeqmodelsLoopedForSequenceClassification`` for ``model.kind: looped``; ``model.kind: ahn`` loads as
  ``SeqmodelsForCausalLM`` too), ``torch_dtype``;
- ``model.safetensors`` (shards and an index above 2 GB) in the PyTorch layouts of ``weight_map``;
- the files of ``seqmodels/export/torch/`` (``EXPORTED_FILES``), which ``transformers`` runs with
  ``trust_remote_code=True``; ``generation_config.json``; the tokenizer files of an ``hf:`` tokenizer.

A new ``model.kind`` adds its entry to ``ARCHITECTURES`` and its classes to ``torch/`` (AHN: the decoder
LM class with ``torch/ahn_seqmodels.AHNBlock`` layers, chosen by ``model.kind``: the frozen base's weights
and each layer's compressor ``blocks.i.ahn``); the weight map needs nothing new while its layers are
``Dense`` / ``DenseOut`` / ``ShortConv`` / ``RMSNorm`` or plain parameters.

``read_seqmodels_params`` is the inverse (``load_pretrained`` of such a directory): the float32
parameter dict, bitwise the exported one for a float32 export.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np

from seqmodels.config import ModelConfig
from seqmodels.export.torch import EXPORTED_FILES, PACKAGE_DIR
from seqmodels.export.weight_map import abstract_unscanned_model, torch_shape, torch_tensor_rules
from seqmodels.hf.errors import HFFormatError
from seqmodels.hf.param_map import get_path, set_path
from seqmodels.hf.safetensors_io import SafetensorsCheckpoint, write_checkpoint

EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
MODEL_TYPE = "seqmodels"
# model.kind -> (architecture class, the transformers Auto class that loads it)
ARCHITECTURES = {"lm": ("SeqmodelsForCausalLM", "AutoModelForCausalLM"),
                 "ahn": ("SeqmodelsForCausalLM", "AutoModelForCausalLM"),  # AHNBlock layers (torch/ahn_seqmodels)
                 "looped": ("SeqmodelsLoopedForSequenceClassification", "AutoModelForSequenceClassification")}
LOOPED_LABELS = {0: "reject", 1: "accept"}  # logits columns of the looped head: <reject>, <accept>


def check_exportable(config: ModelConfig) -> None:
    """``HFFormatError`` unless every module of ``config`` has a PyTorch counterpart in ``export/torch``."""
    from seqmodels.export.torch.modeling_seqmodels import MIXERS
    if config.kind not in ARCHITECTURES:
        raise HFFormatError(f"model.kind {config.kind!r} has no PyTorch export yet; exported kinds: "
                            f"{', '.join(ARCHITECTURES)}")
    for name in config.mixers_in_use:
        if name not in MIXERS:
            raise HFFormatError(f"mixer {name!r} has no PyTorch module in seqmodels/export/torch; exported mixers: "
                                f"{', '.join(sorted(MIXERS))}")


def torch_tensors(config: ModelConfig, params: dict, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Every PyTorch tensor of ``params`` (unscanned ``nnx.to_pure_dict`` layout), cast to ``dtype``."""
    if dtype not in EXPORT_DTYPES:
        raise HFFormatError(f"dtype {dtype!r} is not an export dtype; one of {', '.join(EXPORT_DTYPES)}")
    return {rule.hf_name: np.ascontiguousarray(rule.to_hf(np.asarray(get_path(params, rule.path), np.float32)))
            .astype(EXPORT_DTYPES[dtype]) for rule in torch_tensor_rules(config)}


def seqmodels_hf_config(config: ModelConfig, *, torch_dtype: str, token_ids: dict | None = None) -> dict:
    """The ``config.json`` dict of an export of ``config`` (module docstring)."""
    from seqmodels.config_io import to_dict
    model = to_dict(dataclasses.replace(config, scan_layers=False, init_from=""))  # self-contained: the weights are here
    architecture, auto_class = ARCHITECTURES[config.kind]
    hf = {"architectures": [architecture], "model_type": MODEL_TYPE,
          "auto_map": {"AutoConfig": "configuration_seqmodels.SeqmodelsConfig",
                       auto_class: f"modeling_seqmodels.{architecture}"},
          "model": model, "torch_dtype": torch_dtype, "dtype": torch_dtype, "use_cache": True}
    if config.kind == "looped":
        hf.update(id2label={str(k): v for k, v in LOOPED_LABELS.items()},
                  label2id={v: k for k, v in LOOPED_LABELS.items()})
    hf.update({key: value for key, value in (token_ids or {}).items() if value is not None})
    return hf


def write_seqmodels(staging: Path, config: ModelConfig, params: dict, *, dtype: str, token_ids: dict,
                    max_shard_bytes: int) -> None:
    """Write the export's files into the (new, empty) directory ``staging``."""
    check_exportable(config)
    write_checkpoint(staging, torch_tensors(config, params, dtype), max_shard_bytes=max_shard_bytes)
    hf_config = seqmodels_hf_config(config, torch_dtype=dtype, token_ids=token_ids)
    (staging / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    for name in EXPORTED_FILES:
        shutil.copyfile(PACKAGE_DIR / name, staging / name)


def seqmodels_model_config(hf: dict, source: str) -> ModelConfig:
    """The ``ModelConfig`` of a seqmodels export's ``config.json`` dict ``hf``."""
    from seqmodels.config import ConfigError
    from seqmodels.config_io import model_config_from_dict
    if not isinstance(hf.get("model"), dict):
        raise HFFormatError(f"{source}: model_type 'seqmodels' needs the 'model' section (a dict), got "
                            f"{type(hf.get('model')).__name__}")
    try:
        return model_config_from_dict(hf["model"])
    except ConfigError as error:
        raise HFFormatError(f"{source}: its 'model' section is not a valid model config: {error}") from None


def read_seqmodels_params(directory: Path, config: ModelConfig) -> dict:
    """The float32 parameter dict (unscanned layout) of the seqmodels export in ``directory``."""
    from flax import nnx
    import jax.numpy as jnp
    checkpoint = SafetensorsCheckpoint(directory)
    rules = torch_tensor_rules(config)
    wanted, present = {rule.hf_name for rule in rules}, set(checkpoint.names())
    for names, what in ((sorted(wanted - present), "is missing"), (sorted(present - wanted), "is not part of")):
        if names:
            raise HFFormatError(f"{directory}: tensor {names[0]!r} {what} the architecture config.json describes "
                                f"({len(names)} such tensors)")
    params = nnx.to_pure_dict(nnx.state(abstract_unscanned_model(config), nnx.Param))
    for rule in rules:
        expected = torch_shape(rule, tuple(get_path(params, rule.path).shape))
        if tuple(checkpoint.shape(rule.hf_name)) != expected:
            raise HFFormatError(f"{checkpoint.file_of(rule.hf_name)}: tensor {rule.hf_name!r} has shape "
                                f"{list(checkpoint.shape(rule.hf_name))}; config.json implies {list(expected)}")
        set_path(params, rule.path, jnp.asarray(rule.to_project(checkpoint.read(rule.hf_name).astype(np.float32))))
    return params
