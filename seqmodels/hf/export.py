"""A model -> a Hugging Face directory, in the first format of ``seqmodels.hf.formats.FORMATS`` that takes it.

- ``llama``: Transformer++ (every layer ``attention``, SwiGLU, no q/k norm or convolution) as a plain
  ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` with q/k/v biases) that ``transformers`` loads with no
  remote code (``seqmodels.hf.llama``).
- ``seqmodels``: every other architecture (AHN included) as ``model_type: seqmodels`` with its own PyTorch
  modules (``seqmodels.hf.remote_code``; loaded with ``trust_remote_code=True``).

``export_model`` writes the format's ``config.json`` (``architectures``, ``torch_dtype``) and
``model.safetensors`` (shards and ``model.safetensors.index.json`` above 2 GB), plus
``generation_config.json`` and the tokenizer files of an ``hf:`` tokenizer; ``export_run`` does so for a
run's checkpoint (``export.py``). ``load_pretrained`` of either gives the exported parameters bitwise (float32).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from seqmodels.config import ModelConfig
from seqmodels.hf.directory import write_json
from seqmodels.hf.formats import FORMATS, export_format
from seqmodels.hf.output_dir import check_new_directory, write_new_directory
from seqmodels.hf.safetensors_io import MAX_SHARD_BYTES
from seqmodels.hf.tensor_rules import check_export_dtype
from seqmodels.data.hf_tokenizer import TOKENIZER_FILES, load_tokenizer
from seqmodels.models.stack import repeat_period, unstack_blocks
from seqmodels.runs.load import load_run_params, read_run_config


def export_model(config: ModelConfig, params: dict, out_dir, *, dtype: str = "float32", tokenizer_dir=None,
                 max_shard_bytes: int = MAX_SHARD_BYTES, force: bool = False) -> Path:
    """Write the Hugging Face directory of ``config`` with ``params`` to ``out_dir`` (module docstring).

    ``out_dir`` must be absent or empty (``force``: an existing directory is replaced once the new one is
    complete); the directory appears only once complete. ``tokenizer_dir``: a Hugging Face directory
    whose tokenizer files are copied and whose special ids enter the configs.
    """
    out_dir = Path(out_dir)
    check_export_dtype(dtype)
    checkpoint_format = FORMATS[export_format(config)]
    check_new_directory(out_dir, force=force)
    tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
    ids = {} if tokenizer is None else {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
                                        "pad_token_id": tokenizer.pad_id}
    if config.scan_layers:  # stacked groups of layers -> one entry per layer, as Hugging Face holds them
        params = unstack_blocks(params, len(config.mixers) // repeat_period(config.mixers))
        config = dataclasses.replace(config, scan_layers=False)

    def write(staging: Path) -> None:
        checkpoint_format.write(staging, config, params, dtype=dtype, token_ids=ids, max_shard_bytes=max_shard_bytes)
        generation = {key: value for key, value in ids.items() if value is not None}
        write_json(staging / "generation_config.json", generation)
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
    export_format(read_run_config(run_dir).model)
    check_new_directory(Path(out_dir), force=force)
    config, params, step = load_run_params(run_dir, step=step)
    tokenizer = config.data.tokenizer
    tokenizer_dir = tokenizer[len("hf:"):] if tokenizer.startswith("hf:") else None
    return export_model(config.model, params, out_dir, dtype=dtype, tokenizer_dir=tokenizer_dir,
                        max_shard_bytes=max_shard_bytes, force=force), step
