"""The configuration schema: typed, frozen dataclasses with a one-line description per field.

A run is described by one ``Config`` (sections ``model``, ``data``, ``optim``, ``train``, ``mesh``,
``checkpoint``, ``log``). ``seqmodels.config_io.load_config`` builds it from a YAML file that states
only what differs from these defaults, plus dotted command-line overrides (``train.steps=20``).
Every section validates its values in ``__post_init__`` and raises ``ConfigError`` naming the field;
a field that takes one of a fixed set of strings is typed ``Literal[...]`` and checked by its type.

``ModelConfig`` is assembled here: the keys of ``seqmodels.config_model.ModelConfigBase`` plus one
field per config section registered with the mixer registry (``seqmodels.mixers.registry``), each
defined beside its mixer (``model.atlas`` in ``seqmodels/mixers/atlas.py``). Importing this module
imports every mixer. The data section lives in ``seqmodels.config_data``, ``model.looped`` in
``seqmodels.config_looped``, ``model.ahn`` in ``seqmodels.config_ahn``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import seqmodels.mixers  # noqa: F401  (imports every mixer module: each registers its sections)
from seqmodels.compilation import default_compilation_cache
from seqmodels.config_base import (MAX_BATCH, MAX_SEED, MAX_STEPS, ConfigError, KernelImpl, _require,
                                   _require_at_least, _require_at_most, _require_choices, describe)
from seqmodels.config_data import (  # noqa: F401  (the data section, re-exported here)
    CFL_LANGUAGES, SYNTHETIC_TASKS, CflDataConfig, DataConfig, SyntheticConfig, needle_min_length)
from seqmodels.config_model import ModelConfigBase
from seqmodels.mixers.registry import SectionEntry, registered_sections, sections_used_by


def _model_post_init(model: ModelConfigBase) -> None:
    """The model keys, then each section a layer reads checked against the model (its ``check_model``)."""
    ModelConfigBase.__post_init__(model)
    for name in sections_used_by(model.mixers_in_use):
        check = getattr(getattr(model, name), "check_model", None)
        if check is not None:
            check(model)


def model_config_class(sections: dict[str, SectionEntry]) -> type:
    """The frozen dataclass ``ModelConfig``: ``ModelConfigBase``'s keys, then one field per entry of
    ``sections`` (``model.<name>``, defaulting to the section's defaults), in the order given."""
    own = {field.name for field in dataclasses.fields(ModelConfigBase)}
    for name in sections:
        if name in own:
            raise ValueError(f"config section model.{name} would replace the model key model.{name}; "
                             "register the section under another name")
    fields = [(name, entry.section, describe(entry.description, factory=entry.section))
              for name, entry in sections.items()]
    return dataclasses.make_dataclass(
        "ModelConfig", fields, bases=(ModelConfigBase,), frozen=True, module=__name__,
        namespace={"__doc__": ModelConfigBase.__doc__, "__post_init__": _model_post_init})


ModelConfig = model_config_class(registered_sections())


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warm-up, then cosine/linear decay or constant)."""

    name: Literal["adamw", "muon"] = describe(
        "adamw, or muon: Muon on the projections of the residual stream, AdamW on the rest", "adamw")
    learning_rate: float = describe("peak learning rate", 3e-3)
    warmup_steps: int = describe("linear warm-up steps from 0 to the peak", 50)
    schedule: Literal["cosine", "linear", "constant"] = describe("learning-rate decay after warm-up", "cosine")
    min_lr_ratio: float = describe("final learning rate as a fraction of the peak", 0.1)
    weight_decay: float = describe("decoupled weight decay (not applied to norms, biases, embeddings)", 0.1)
    b1: float = describe("Adam beta1", 0.9)
    b2: float = describe("Adam beta2", 0.95)
    eps: float = describe("Adam epsilon", 1e-8)
    grad_clip: float = describe("clip the global gradient norm to this; 0 = no clipping", 1.0)
    muon_momentum: float = describe("muon: momentum of the gradient EMA", 0.95)
    muon_ns_steps: int = describe("muon: Newton-Schulz steps", 5)
    muon_per_head: bool = describe("muon: orthogonalise each attention head's block on its own", False)
    muon_impl: KernelImpl = describe("muon: Newton-Schulz implementation (as model.kernel_impl)", "auto")
    muon_adam_learning_rate: float = describe(
        "muon: peak learning rate of the AdamW group (embeddings, head, norms, biases); 0 = learning_rate", 0.0)

    def __post_init__(self):
        _require_choices(self, "optim")
        _require(self.learning_rate > 0, "optim.learning_rate", "must be > 0")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _require(0.0 <= self.min_lr_ratio <= 1.0, "optim.min_lr_ratio", "must be in [0, 1]")
        _require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _require(0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0, "optim.b1/b2", "must be in [0, 1)")
        _require(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0")
        _require(self.eps > 0, "optim.eps", f"must be > 0 (Adam divides by sqrt(v) + eps), got {self.eps}")
        _require(0.0 <= self.muon_momentum < 1.0, "optim.muon_momentum", "must be in [0, 1)")
        _require(self.muon_ns_steps >= 0, "optim.muon_ns_steps", "must be >= 0")
        _require(self.muon_adam_learning_rate >= 0, "optim.muon_adam_learning_rate", "must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    """The training loop."""

    steps: int = describe("optimizer steps", 300)
    batch_size: int = describe("sequences per optimizer step, over all devices and micro-batches", 8)
    grad_accum: int = describe("micro-batches per step (batch_size must be divisible by it)", 1)
    exit_at_step: int = describe(
        "checkpoint and stop after this step though train.steps is larger (time-limited jobs); 0 = off", 0)
    seed: int = describe("seed of parameter initialisation", 0)
    run_dir: str = describe("directory of checkpoints, logs and the resolved config", "runs/default")
    guard_steps: int = describe(
        "stop (before saving) after this many consecutive anomalous steps: zero gradient norm, or loss more than "
        "train.guard_sigma running standard deviations above its running mean; 0 = off", 4)
    guard_sigma: float = describe("loss spike threshold of the guard, in running standard deviations", 6.0)
    compilation_cache: str = describe(
        "directory of the persistent XLA compilation cache (a resumed or repeated run reads its compiled programs "
        "back); '' = off; default $SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla",
        factory=default_compilation_cache)

    def __post_init__(self):
        _require_at_least(self, "train", steps=1, batch_size=1, grad_accum=1, seed=0)
        _require_at_most(self, "train", steps=MAX_STEPS, batch_size=MAX_BATCH, seed=MAX_SEED)
        _require(self.batch_size % self.grad_accum == 0, "train.batch_size",
                 f"{self.batch_size} is not divisible by train.grad_accum={self.grad_accum}")
        _require(0 <= self.exit_at_step <= self.steps, "train.exit_at_step",
                 f"must be in [0, train.steps={self.steps}], got {self.exit_at_step}")
        _require(bool(self.run_dir), "train.run_dir", "must not be empty")
        _require(self.guard_steps >= 0, "train.guard_steps", f"must be >= 0, got {self.guard_steps}")
        _require(self.guard_sigma > 0, "train.guard_sigma", f"must be > 0, got {self.guard_sigma}")


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh. Sizes data x fsdp x context x tensor multiply to the device count; data, fsdp or tensor
    may be -1 (fill)."""

    data: int = describe("data-parallel axis size (-1 = all remaining devices)", -1)
    fsdp: int = describe("fully-sharded data-parallel axis size (parameters sharded, batch split)", 1)
    tensor: int = describe("tensor-parallel axis size (heads / MLP hidden / vocab split)", 1)
    context: int = describe("context-parallel axis size: each row's data.seq_len tokens are split into this many "
                            "contiguous shards, one per device (must divide data.seq_len)", 1)
    dcn_data: int = describe("of mesh.data, how many ways are across slices / hosts (DCN); the rest is within "
                             "a slice (ICI)", 1)
    dcn_fsdp: int = describe("of mesh.fsdp, how many ways are across slices / hosts (DCN)", 1)
    dcn_tensor: int = describe("of mesh.tensor, how many ways are across slices / hosts (DCN); keep 1", 1)

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        _require(all(s == -1 or s >= 1 for s in sizes), "mesh", f"sizes must be >= 1 or -1, got {sizes}")
        _require(sizes.count(-1) <= 1, "mesh", f"at most one size may be -1, got {sizes}")
        _require(self.context >= 1, "mesh.context", f"must be >= 1 (1 = the sequence is not split), got {self.context}")
        for axis in ("data", "fsdp", "tensor"):
            dcn, size = getattr(self, f"dcn_{axis}"), getattr(self, axis)
            _require(dcn >= 1, f"mesh.dcn_{axis}", f"must be >= 1, got {dcn}")
            _require(size == -1 or size % dcn == 0, f"mesh.dcn_{axis}",
                     f"{dcn} must divide mesh.{axis} = {size} (the DCN ways are part of the axis)")


@dataclass(frozen=True)
class CheckpointConfig:
    """orbax checkpoints of the train state and the data-iterator state."""

    every_steps: int = describe("save every this many steps (and always at the end or on SIGTERM)", 100)
    keep: int = describe("keep the last this many checkpoints", 3)
    keep_period: int = describe(
        "never rotate out a checkpoint whose step is a multiple of this (orbax keep_period); 0 = off", 1000)
    allow_changes: tuple[str, ...] = describe(
        "keys (or sections) a resume may change from the checkpoint's settings, e.g. [train.steps]; others are "
        "refused (model.* never changes)", factory=tuple)
    async_save: bool = describe("write checkpoints in the background", True)
    resume: bool = describe("resume from the latest checkpoint in train.run_dir if there is one", True)

    def __post_init__(self):
        _require(self.every_steps >= 1, "checkpoint.every_steps", "must be >= 1")
        _require(self.keep >= 1, "checkpoint.keep", "must be >= 1")
        _require(self.keep_period >= 0, "checkpoint.keep_period", f"must be >= 0, got {self.keep_period}")


@dataclass(frozen=True)
class LogConfig:
    """Metrics: TensorBoard event files, a JSONL log, a progress bar."""

    every_steps: int = describe("write metrics every this many steps", 10)
    tensorboard: bool = describe("write TensorBoard event files under run_dir/tb", True)
    progress: Literal["auto", "always", "never"] = describe("progress bar; auto: only on a terminal", "auto")
    peak_flops_per_device: float = describe(
        "peak FLOP/s of one device for MFU; 0 = known table, or measured matmul rate on CPU", 0.0)

    def __post_init__(self):
        _require_choices(self, "log")
        _require(self.every_steps >= 1, "log.every_steps", "must be >= 1")
        _require(self.peak_flops_per_device >= 0, "log.peak_flops_per_device", "must be >= 0")


@dataclass(frozen=True)
class Config:
    """One run: every section of the configuration."""

    model: ModelConfig = describe("the model", factory=ModelConfig)
    data: DataConfig = describe("the data", factory=DataConfig)
    optim: OptimConfig = describe("the optimizer", factory=OptimConfig)
    train: TrainConfig = describe("the loop", factory=TrainConfig)
    mesh: MeshConfig = describe("the device mesh", factory=MeshConfig)
    checkpoint: CheckpointConfig = describe("checkpoints", factory=CheckpointConfig)
    log: LogConfig = describe("metrics", factory=LogConfig)

    def __post_init__(self):
        _require(self.data.seq_len <= self.model.max_seq_len, "data.seq_len",
                 f"{self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}; "
                 "raise model.max_seq_len or shorten data.seq_len")
