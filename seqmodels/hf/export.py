"""A model -> a Hugging Face directory, in the first export format (``EXPORT_FORMATS``) that takes it.

- ``llama``: Transformer++ (every layer ``attention``, SwiGLU, no q/k norm or convolution) as a plain
  ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` with q/k/v biases) that ``transformers`` loads with no
  remote code; the layout is ``seqmodels.hf.param_map`` read backwards.
- ``seqmodels``: every other architecture (AHN included) as ``model_type: seqmodels`` with its own PyTorch modules
  (``seqmodels.export.writer``; loaded with ``trust_remote_code=True``).

``export_model`` writes ``config.json`` (``architectures``, ``torch_dtype``), ``model.safetensors``
(shards and ``model.safetensors.index.json`` above 2 GB) and ``generation_config.json``, plus the
tokenizer files of an ``hf:`` tokenizer; ``export_run`` does so for a run's checkpoint (``export.py``).
``load_pretrained`` of either gives the exported parameters bitwise (float32).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.export import writer as seqmodels_writer
from seqmodels.hf.config_map import check_exportable, hf_config_from_model
from seqmodels.hf.errors import HFFormatError
from seqmodels.hf.output_dir import check_new_directory, write_new_directory
from seqmodels.hf.param_map import get_path, tensor_rules
from seqmodels.hf.safetensors_io import MAX_SHARD_BYTES, write_checkpoint
from seqmodels.hf.tokenizer import TOKENIZER_FILES, load_tokenizer
from seqmodels.models.stack import repeat_period, unstack_blocks

EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def hf_tensors(config: ModelConfig, params: dict, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Every Hugging Face tensor of the parameter dict ``params`` (``nnx.to_pure_dict`` layout), cast to ``dtype``."""
    if dtype not in EXPORT_DTYPES:
        raise HFFormatError(f"dtype {dtype!r} is not an export dtype; one of {', '.join(EXPORT_DTYPES)}")
    return {rule.hf_name: np.ascontiguousarray(rule.to_hf(np.asarray(get_path(params, rule.path), np.float32)))
            .astype(EXPORT_DTYPES[dtype]) for rule in tensor_rules(config)}


def _is_llama(config: ModelConfig) -> bool:
    try:
        check_exportable(config)
    except HFFormatError:
        return False
    return True


def _write_llama(staging: Path, config: ModelConfig, params: dict, *, dtype: str, token_ids: dict,
                 max_shard_bytes: int) -> None:
    write_checkpoint(staging, hf_tensors(config, params, dtype), max_shard_bytes=max_shard_bytes)
    hf_config = hf_config_from_model(config, torch_dtype=dtype, token_ids=token_ids)
    (staging / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")


def _is_seqmodels(config: ModelConfig) -> bool:
    seqmodels_writer.check_exportable(config)  # raises naming what has no PyTorch module
    return True


# name -> (accepts(config), write(staging, config, params, ...)); the first that accepts writes the export
EXPORT_FORMATS = {"llama": (_is_llama, _write_llama), "seqmodels": (_is_seqmodels, seqmodels_writer.write_seqmodels)}


def export_format(config: ModelConfig) -> str:
    """The name of the export format of ``config``: ``llama`` for Transformer++, else ``seqmodels``."""
    for name, (accepts, _) in EXPORT_FORMATS.items():
        if accepts(config):
            return name
    raise HFFormatError(f"no export format takes model.kind {config.kind!r} with mixers {list(config.mixers_in_use)}")


def export_model(config: ModelConfig, params: dict, out_dir, *, dtype: str = "float32", tokenizer_dir=None,
                 max_shard_bytes: int = MAX_SHARD_BYTES, force: bool = False) -> Path:
    """Write the Hugging Face directory of ``config`` with ``params`` to ``out_dir`` (module docstring).

    ``out_dir`` must be absent or empty (``force``: an existing directory is replaced once the new one is
    complete); the directory appears only once complete. ``tokenizer_dir``: a Hugging Face directory
    whose tokenizer files are copied and whose special ids enter the configs.
    """
    out_dir = Path(out_dir)
    if dtype not in EXPORT_DTYPES:
        raise HFFormatError(f"dtype {dtype!r} is not an export dtype; one of {', '.join(EXPORT_DTYPES)}")
    write_format = EXPORT_FORMATS[export_format(config)][1]
    check_new_directory(out_dir, force=force)
    tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
    ids = {} if tokenizer is None else {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
                                        "pad_token_id": tokenizer.pad_id}
    if config.scan_layers:  # stacked groups of layers -> one entry per layer, as Hugging Face holds them
        params = unstack_blocks(params, len(config.mixers) // repeat_period(config.mixers))
        config = dataclasses.replace(config, scan_layers=False)

    def write(staging: Path) -> None:
        write_format(staging, config, params, dtype=dtype, token_ids=ids, max_shard_bytes=max_shard_bytes)
        generation = {key: value for key, value in ids.items() if value is not None}
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for name in TOKENIZER_FILES if tokenizer is not None else ():
            if (tokenizer.directory / name).is_file():
                shutil.copyfile(tokenizer.directory / name, staging / name)

    return write_new_directory(out_dir, write, force=force)


def export_run(run_dir, out_dir, *, step: int | None = None, dtype: str = "float32",
               max_shard_bytes: int = MAX_SHARD_BYTES, force: bool = False) -> tuple[Path, int]:
    """Export the checkpoint of ``run_dir`` at ``step`` (default: the latest); returns ``(out_dir, step)``.

    The architecture and ``out_dir`` are checked from the run's ``config.yaml`` before any checkpoint
    is read; nothing is written unless the export succeeds.
    """
    from seqmodels.config_io import config_from_dict, read_yaml
    from seqmodels.evaluation.loading import load_run
    from seqmodels.training.checkpoint import CheckpointError

    config_path = Path(run_dir) / "config.yaml"
    if not config_path.is_file():
        raise CheckpointError(f"{run_dir} is not a run directory: it has no config.yaml (train.py writes one)")
    export_format(config_from_dict(read_yaml(config_path)).model)
    check_new_directory(Path(out_dir), force=force)
    config, model, step = load_run(run_dir, step=step)
    tokenizer = config.data.tokenizer
    tokenizer_dir = tokenizer[len("hf:"):] if tokenizer.startswith("hf:") else None
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return export_model(config.model, params, out_dir, dtype=dtype, tokenizer_dir=tokenizer_dir,
                        max_shard_bytes=max_shard_bytes, force=force), step
