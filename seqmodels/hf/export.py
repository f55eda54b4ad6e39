"""A model -> a Hugging Face directory, in the first format of ``seqmodels.hf.formats.FORMATS`` that takes it.

- ``llama``: Transformer++ (every layer ``attention``, SwiGLU, no q/k norm or convolution) as a plain
  ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` with q/k/v biases) that ``transformers`` loads with no
  remote code (``seqmodels.hf.llama``).
- ``mamba2``: a Mamba2 LM in the reference layout (every layer ``mamba2``, no MLP, the gated norm over all
  heads) as transformers' own ``Mamba2ForCausalLM`` (``seqmodels.hf.mamba2``).
- ``seqmodels``: every other architecture (AHN included) as ``model_type: seqmodels`` with its own PyTorch
  modules (``seqmodels.hf.remote_code``; loaded with ``trust_remote_code=True``).
- ``fla`` (only when named: ``format_name="fla"``): a DeltaNet / Gated DeltaNet LM whose convolution biases are zero
  as flash-linear-attention's ``GatedDeltaNetForCausalLM`` / ``DeltaNetForCausalLM`` (``seqmodels.hf.fla``).

``export_model`` writes the format's ``config.json`` (``architectures``, ``torch_dtype``) and
``model.safetensors`` (shards and ``model.safetensors.index.json`` above 2 GB), plus
``generation_config.json`` and the tokenizer: an ``hf:DIR`` tokenizer's files as they are, the byte-level
tokenizer as a ``tokenizer.json`` of its own (``seqmodels.data.hf_tokenizer.write_byte_level_tokenizer``);
the special ids enter ``config.json`` and ``generation_config.json``. ``export_run`` does so for a run's
checkpoint (``export.py``), with the run's ``data.tokenizer`` when its data source encodes text with it
(a generated task's vocabulary has no tokenizer to carry). ``load_pretrained`` of either gives the
exported parameters bitwise (float32).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from seqmodels.config import ModelConfig
from seqmodels.errors import HFFormatError
from seqmodels.hf.directory import write_json
from seqmodels.hf.formats import FORMATS, export_format
from seqmodels.hf.output_dir import check_new_directory, write_new_directory
from seqmodels.hf.safetensors_io import MAX_SHARD_BYTES
from seqmodels.hf.tensor_rules import check_export_dtype
from seqmodels.data.hf_tokenizer import TOKENIZER_FILES, load_tokenizer, write_byte_level_tokenizer
from seqmodels.data.sources import get_source
from seqmodels.data.tokenizers import ByteTokenizer
from seqmodels.models.stack import repeat_period, unstack_blocks
from seqmodels.runs.load import load_run_params, read_run_config


def _tokenizer_writer(tokenizer: str | None, config: ModelConfig):
    """``(special ids, write(directory))`` of the ``data.tokenizer`` value ``tokenizer`` (None: no tokenizer)."""
    if tokenizer is None:
        return {}, lambda directory: None
    if tokenizer == ByteTokenizer.name:
        byte = ByteTokenizer()
        if config.vocab_size < byte.vocab_size:
            raise HFFormatError(f"the byte-level tokenizer has {byte.vocab_size} ids but the model's vocabulary "
                                f"(model.vocab_size) is {config.vocab_size}; export it without a tokenizer")
        ids = {"bos_token_id": byte.bos_id, "eos_token_id": byte.eos_id, "pad_token_id": byte.eos_id}
        return ids, lambda directory: write_byte_level_tokenizer(directory, bos_id=byte.bos_id, eos_id=byte.eos_id)
    if not tokenizer.startswith("hf:") or len(tokenizer) == len("hf:"):
        raise HFFormatError(f"tokenizer {tokenizer!r} is not one an export can carry: 'byte', 'hf:DIR' or None")
    loaded = load_tokenizer(tokenizer[len("hf:"):])

    def copy(directory: Path) -> None:
        for name in TOKENIZER_FILES:
            if (loaded.directory / name).is_file():
                shutil.copyfile(loaded.directory / name, directory / name)

    return {"bos_token_id": loaded.bos_id, "eos_token_id": loaded.eos_id, "pad_token_id": loaded.pad_id}, copy


def export_model(config: ModelConfig, params: dict, out_dir, *, dtype: str = "float32", tokenizer: str | None = None,
                 max_shard_bytes: int = MAX_SHARD_BYTES, force: bool = False, format_name: str | None = None) -> Path:
    """Write the Hugging Face directory of ``config`` with ``params`` to ``out_dir`` (module docstring).

    ``out_dir`` must be absent or empty (``force``: an existing directory is replaced once the new one is
    complete); the directory appears only once complete. ``tokenizer``: a ``data.tokenizer`` value whose
    tokenizer the directory carries (``byte``, or ``hf:DIR``: a Hugging Face directory whose tokenizer files
    are copied), its special ids in the configs; None: no tokenizer. ``format_name``: the format to
    write (``seqmodels.hf.formats.FORMATS``); None: the first that takes the model.
    """
    out_dir = Path(out_dir)
    check_export_dtype(dtype)
    checkpoint_format = FORMATS[export_format(config, format_name)]
    check_new_directory(out_dir, force=force)
    ids, write_tokenizer = _tokenizer_writer(tokenizer, config)
    if config.scan_layers:  # stacked groups of layers -> one entry per layer, as Hugging Face holds them
        params = unstack_blocks(params, len(config.mixers) // repeat_period(config.mixers))
        config = dataclasses.replace(config, scan_layers=False)

    def write(staging: Path) -> None:
        checkpoint_format.write(staging, config, params, dtype=dtype, token_ids=ids, max_shard_bytes=max_shard_bytes)
        generation = {key: value for key, value in ids.items() if value is not None}
        write_json(staging / "generation_config.json", generation)
        write_tokenizer(staging)

    return write_new_directory(out_dir, write, force=force)


def export_run(run_dir, out_dir, *, step: int | None = None, dtype: str = "float32",
               max_shard_bytes: int = MAX_SHARD_BYTES, force: bool = False,
               format_name: str | None = None) -> tuple[Path, int]:
    """Export the checkpoint of ``run_dir`` at ``step`` (default: the latest); returns ``(out_dir, step)``.

    The architecture and ``out_dir`` are checked from the run's ``config.yaml`` before any checkpoint
    is read (``format_name`` as in ``export_model``); nothing is written unless the export succeeds.
    """
    export_format(read_run_config(run_dir).model, format_name)
    check_new_directory(Path(out_dir), force=force)
    config, params, step = load_run_params(run_dir, step=step)
    tokenizer = config.data.tokenizer if get_source(config.data.source).encodes_text else None
    return export_model(config.model, params, out_dir, dtype=dtype, tokenizer=tokenizer,
                        max_shard_bytes=max_shard_bytes, force=force, format_name=format_name), step
