"""Every checkpoint format, one module each that reads and writes it, behind one registry (``FORMATS``).

    llama        Llama / Qwen2 safetensors: Transformer++ that transformers loads without remote code
    mamba2       transformers' Mamba2ForCausalLM: a Mamba2 LM in the reference layout (no MLP), no remote code
    seqmodels    ``model_type: seqmodels`` with its own PyTorch modules: every architecture (``remote_code``)
    fla          flash-linear-attention's GatedDeltaNetForCausalLM / DeltaNetForCausalLM (written on request only)

A directory's format is the one whose ``MODEL_TYPES`` hold its ``config.json``'s ``model_type`` (a
config.json without one is read as Llama, as older Hugging Face checkpoints are); a model is written in
the first format of ``FORMATS`` that takes it, so Transformer++ stays a plain Llama, a reference-layout
Mamba2 a plain Mamba2, and everything else brings its own modules. A format in ``ON_REQUEST`` is written
only when the export names it (``export.py --format``): fla's layout has no convolution bias, so whether a
DeltaNet model fits it depends on its weights, not its config. GGUF files come in through
``seqmodels.hf.gguf``, which converts them into the Llama format. Export (``seqmodels.hf.export``),
``load_pretrained`` and the bases that a model starts from (``model.init_from``, ``model.ahn.base``:
``seqmodels.hf.base``) all go through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.hf import fla, llama, mamba2, remote_code
from seqmodels.hf.directory import hf_directory, read_json
from seqmodels.errors import HFFormatError, reading
from seqmodels.models import abstract_model


class CheckpointFormat(Protocol):
    """What a format module offers (``llama``, ``mamba2``, ``fla``, ``remote_code``)."""

    MODEL_TYPES: tuple[str, ...]

    def check_exportable(self, model: ModelConfig) -> None:
        """``HFFormatError`` saying why ``model`` cannot be written in this format."""

    def read_config(self, hf: dict, source: str, base: ModelConfig | None = None) -> ModelConfig:
        """The ``ModelConfig`` of the ``config.json`` dict ``hf``; settings that are not the architecture
        come from ``base``."""

    def read_params(self, directory: Path, config: ModelConfig) -> dict:
        """The float32 parameter dict (``nnx.to_pure_dict`` layout) of the directory's checkpoint."""

    def write(self, directory: Path, config: ModelConfig, params: dict, *, dtype: str, token_ids: dict,
              max_shard_bytes: int) -> None:
        """Write ``config.json`` and the checkpoint (and any modules the format needs) into ``directory``."""


FORMATS: dict[str, CheckpointFormat] = {"llama": llama, "mamba2": mamba2,  # in export preference order
                                         "seqmodels": remote_code, "fla": fla}
ON_REQUEST = ("fla",)  # formats written only when an export names them


def format_of(hf: dict, source: str) -> CheckpointFormat:
    """The format that reads the ``config.json`` dict ``hf`` (module docstring)."""
    model_type = hf.get("model_type", llama.MODEL_TYPES[0])
    for checkpoint_format in FORMATS.values():
        if model_type in checkpoint_format.MODEL_TYPES:
            return checkpoint_format
    readable = ", ".join(f"{t} ({name})" for name, f in FORMATS.items() for t in f.MODEL_TYPES)
    raise HFFormatError(f"{source}: model_type {model_type!r} is not a format this project reads; readable: "
                        f"{readable}")


def export_format(config: ModelConfig, name: str | None = None) -> str:
    """``name`` when that format writes ``config`` (its reason when not), else the first format outside
    ``ON_REQUEST`` that writes it (the last one's reason when none does)."""
    if name is not None:
        if name not in FORMATS:
            raise HFFormatError(f"export format {name!r} is not one of {', '.join(FORMATS)}")
        FORMATS[name].check_exportable(config)
        return name
    reasons = []
    for candidate, checkpoint_format in FORMATS.items():
        if candidate in ON_REQUEST:
            continue
        try:
            checkpoint_format.check_exportable(config)
        except HFFormatError as error:
            reasons.append(error)
            continue
        return candidate
    raise reasons[-1]


def _read(path) -> tuple[Path, dict, CheckpointFormat]:
    directory = hf_directory(path)
    hf = read_json(directory / "config.json")
    with reading(directory / "config.json", "config.json"):
        return directory, hf, format_of(hf, str(directory / "config.json"))


def load_model_config(path, base: ModelConfig | None = None) -> ModelConfig:
    """The ``ModelConfig`` of the directory's ``config.json`` (non-architecture settings from ``base``)."""
    directory, hf, checkpoint_format = _read(path)
    with reading(directory / "config.json", "config.json"):  # a field of the wrong type or shape
        return checkpoint_format.read_config(hf, str(directory / "config.json"), base)


def load_pretrained_params(path, config: ModelConfig) -> dict:
    """The nested float32 parameter dict (``nnx.to_pure_dict`` layout) of the directory's checkpoint for ``config``."""
    directory, _, checkpoint_format = _read(path)
    with reading(directory, "model directory's safetensors checkpoint"):
        return checkpoint_format.read_params(directory, config)


def load_pretrained(path, *, base: ModelConfig | None = None):
    """The model of the Hugging Face directory ``path``: the ``LM`` of a ``LlamaForCausalLM`` /
    ``Qwen2ForCausalLM``, or the ``LM`` / ``LoopedModel`` / ``AHNModel`` of a seqmodels export (bitwise its
    parameters).

    ``model.config`` is the ``ModelConfig`` built from ``config.json``; ``base`` supplies the settings
    that are not the architecture (e.g. ``compute_dtype``). Raises ``HFFormatError`` naming the file and
    what is wrong: no config.json, an unsupported architecture or field, a missing shard or tensor, a
    tensor whose shape does not match the config. Parameters are float32 (bfloat16 and float16
    checkpoints are widened exactly).
    """
    config = load_model_config(path, base)
    params = load_pretrained_params(path, config)
    graphdef, _ = abstract_model(config)
    return nnx.merge(graphdef, params)
