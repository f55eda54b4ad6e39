"""``load_pretrained(path)``: a Hugging Face Llama / Qwen2 directory as the project's Transformer++, or a
``model_type: seqmodels`` export (``seqmodels.export.writer``) as the model it was exported from.

The directory holds ``config.json`` (mapped by ``seqmodels.hf.config_map``) and ``model.safetensors``
or shards listed by ``model.safetensors.index.json``; every tensor is checked against the shape the
config implies and mapped by ``seqmodels.hf.param_map``. Parameters are float32 (bfloat16 and float16
checkpoints are widened exactly).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.hf.config_map import model_config_from_hf
from seqmodels.hf.directory import hf_directory
from seqmodels.hf.errors import HFFormatError
from seqmodels.hf.param_map import get_path, set_path, tensor_rules
from seqmodels.hf.safetensors_io import SafetensorsCheckpoint
from seqmodels.training.state import abstract_model

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints store; recomputed from rope_theta


def read_json(path: Path) -> dict:
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise HFFormatError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise HFFormatError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


SEQMODELS_MODEL_TYPE = "seqmodels"
RUN_SETTINGS = ("compute_dtype", "kernel_impl", "remat")  # what ``base`` sets in a seqmodels export's config


def load_model_config(path, base: ModelConfig | None = None) -> ModelConfig:
    """The ``ModelConfig`` of the directory's ``config.json`` (non-architecture settings from ``base``)."""
    config_path = hf_directory(path) / "config.json"
    hf = read_json(config_path)
    if hf.get("model_type") == SEQMODELS_MODEL_TYPE:
        from seqmodels.export.writer import seqmodels_model_config
        config = seqmodels_model_config(hf, str(config_path))
        return config if base is None else dataclasses.replace(
            config, **{name: getattr(base, name) for name in RUN_SETTINGS})
    return model_config_from_hf(hf, str(config_path), base)


def _check_names(checkpoint: SafetensorsCheckpoint, config: ModelConfig, wanted: set[str]) -> None:
    present = set(checkpoint.names())
    missing = sorted(wanted - present)
    if missing:
        raise HFFormatError(f"{checkpoint.directory}: tensor {missing[0]!r} is missing ({len(missing)} missing in "
                            "all); the checkpoint does not hold the model its config.json describes")
    allowed = wanted | ({"lm_head.weight"} if config.tie_embeddings else set())
    unexpected = sorted(name for name in present - allowed if not name.endswith(IGNORED_SUFFIXES))
    if unexpected:
        raise HFFormatError(f"{checkpoint.file_of(unexpected[0])}: tensor {unexpected[0]!r} is not part of the "
                            f"architecture config.json describes ({len(unexpected)} such tensors)")


def load_pretrained_params(path, config: ModelConfig) -> dict:
    """The nested float32 parameter dict (``nnx.to_pure_dict`` layout) of the directory's checkpoint for ``config``."""
    directory = hf_directory(path)
    if read_json(directory / "config.json").get("model_type") == SEQMODELS_MODEL_TYPE:
        from seqmodels.export.writer import read_seqmodels_params
        return read_seqmodels_params(directory, dataclasses.replace(config, scan_layers=False))
    checkpoint = SafetensorsCheckpoint(directory)
    rules = tensor_rules(config)
    _check_names(checkpoint, config, {rule.hf_name for rule in rules})
    _, abstract_state = abstract_model(config)
    params = nnx.to_pure_dict(abstract_state)
    for rule in rules:
        expected = get_path(params, rule.path).shape
        hf_shape = rule.to_hf(np.empty(expected, np.uint8)).shape
        if checkpoint.shape(rule.hf_name) != hf_shape:
            raise HFFormatError(f"{checkpoint.file_of(rule.hf_name)}: tensor {rule.hf_name!r} has shape "
                                f"{list(checkpoint.shape(rule.hf_name))}; {directory / 'config.json'} implies "
                                f"{list(hf_shape)}")
        value = rule.to_project(checkpoint.read(rule.hf_name).astype(np.float32))
        set_path(params, rule.path, jnp.asarray(value))
    return params


def load_pretrained(path, *, base: ModelConfig | None = None):
    """The model of the Hugging Face directory ``path``: the ``LM`` of a ``LlamaForCausalLM`` /
    ``Qwen2ForCausalLM``, or the ``LM`` / ``LoopedModel`` / ``AHNModel`` of a seqmodels export (bitwise its
    parameters).

    ``model.config`` is the ``ModelConfig`` built from ``config.json``; ``base`` supplies the settings
    that are not the architecture (e.g. ``compute_dtype``). Raises ``HFFormatError`` naming the file and
    what is wrong: no config.json, an unsupported architecture or field, a missing shard or tensor, a
    tensor whose shape does not match the config.
    """
    config = load_model_config(path, base)
    params = load_pretrained_params(path, config)
    graphdef, _ = abstract_model(config)
    return nnx.merge(graphdef, params)
