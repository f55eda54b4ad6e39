"""The configuration schema: typed, frozen dataclasses with a one-line description per field.

A run is described by one ``Config`` (sections ``model``, ``data``, ``optim``, ``train``, ``mesh``,
``checkpoint``, ``log``). ``seqmodels.config_io.load_config`` builds it from a YAML file that states
only what differs from these defaults, plus dotted command-line overrides (``train.steps=20``).
Every section validates its values in ``__post_init__`` and raises ``ConfigError`` naming the field;
a field that takes one of a fixed set of strings is typed ``Literal[...]`` and checked by its type.
The mixers' sections live in ``seqmodels.config_mixers``, the data section in ``seqmodels.config_data``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seqmodels.config_ahn import AHNConfig
from seqmodels.config_data import (  # noqa: F401  (the data section, re-exported here)
    CFL_LANGUAGES, SYNTHETIC_TASKS, CflDataConfig, DataConfig, SyntheticConfig, needle_min_length)
from seqmodels.config_base import ConfigError, _require, _require_at_least, _require_choices, describe
from seqmodels.config_mixers import (  # noqa: F401  (sections of ModelConfig, re-exported here)
    AtlasConfig, AttentionConfig, DeltaNetConfig, LonghornConfig, LoopedConfig, Mamba2Config, MuonSSMConfig,
    SlidingWindowConfig)

# pallas_kernels implementations (pallas_kernels._common.IMPLS).
KernelImpl = Literal["auto", "reference", "xla", "pallas", "pallas_triton", "pallas_tpu"]


@dataclass(frozen=True)
class ModelConfig:
    """A decoder language model assembled from a list of mixers, each followed by a SwiGLU MLP."""

    vocab_size: int = describe("embedding rows; must cover the tokenizer's vocabulary", 320)
    d_model: int = describe("residual stream width", 128)
    num_heads: int = describe("attention / mixer heads", 4)
    mixers: tuple[str, ...] = describe(
        "mixer of each layer, a list or an expression like '[swa, attention] * 4'",
        factory=lambda: ("attention",) * 4)
    mlp: bool = describe("a SwiGLU MLP after every mixer (Transformer++ layout)", True)
    d_ff: int = describe("SwiGLU hidden width; 0 = 8/3 * d_model rounded up to a multiple of 64", 0)
    norm_eps: float = describe("RMSNorm epsilon", 1e-6)
    tie_embeddings: bool = describe("share the input embedding with the output head", True)
    max_seq_len: int = describe("longest sequence the model accepts (training rows and decoding)", 4096)
    compute_dtype: Literal["float32", "bfloat16"] = describe("activation / matmul dtype (params stay float32)",
                                                             "float32")
    kernel_impl: KernelImpl = describe(
        "pallas_kernels implementation for recurrent mixers: auto (the platform's Pallas kernels on GPU / TPU "
        "where the op has them, else xla), xla, pallas (the platform's kernels), pallas_triton, pallas_tpu "
        "(one family; on CPU in interpret mode), reference", "auto")
    remat: Literal["none", "full", "dots", "names"] = describe("rematerialisation per layer", "none")
    scan_layers: bool = describe("run the repeated group of model.mixers as one lax.scan over stacked "
                                 "parameters (compile time independent of depth)", False)
    init_std: float = describe("standard deviation of the normal initialiser of weights", 0.02)
    attention: AttentionConfig = describe("attention settings", factory=AttentionConfig)
    swa: SlidingWindowConfig = describe("sliding-window attention settings", factory=SlidingWindowConfig)
    atlas: AtlasConfig = describe("Atlas / Titans memory settings", factory=AtlasConfig)
    mamba2: Mamba2Config = describe("Mamba2 (SSD) settings", factory=Mamba2Config)
    longhorn: LonghornConfig = describe("LongHorn settings (longhorn, muonssm_longhorn)", factory=LonghornConfig)
    deltanet: DeltaNetConfig = describe("DeltaNet / Gated DeltaNet settings", factory=DeltaNetConfig)
    muonssm: MuonSSMConfig = describe("MuonSSM settings (muonssm_* mixers)", factory=MuonSSMConfig)
    kind: Literal["lm", "looped", "ahn"] = describe(
        "lm (decoder LM over model.mixers) | looped (looped padded transformer, model.looped) | ahn (a frozen "
        "base with sliding-window attention and a compressor per layer, model.ahn)", "lm")
    looped: LoopedConfig = describe("looped padded transformer settings", factory=LoopedConfig)
    ahn: AHNConfig = describe("AHN settings (model.kind = ahn)", factory=AHNConfig)
    init_from: str = describe(
        "'' (random initialisation) | hf:DIR: a Hugging Face Llama / Qwen2 directory (seqmodels.hf) whose "
        "architecture becomes this model section and whose weights start the run", "")

    def __post_init__(self):
        _require_choices(self, "model")
        _require_at_least(self, "model", vocab_size=1, d_model=1, num_heads=1, max_seq_len=1, d_ff=0)
        _require(self.d_model % self.num_heads == 0, "model.d_model",
                 f"{self.d_model} is not divisible by model.num_heads={self.num_heads}")
        kv_heads = self.attention.num_kv_heads or self.num_heads
        _require(self.num_heads % kv_heads == 0, "model.attention.num_kv_heads",
                 f"{kv_heads} does not divide model.num_heads={self.num_heads}")
        _require(len(self.mixers) >= 1, "model.mixers", "needs at least one layer")
        _require(self.init_from == "" or self.init_from.startswith("hf:") and len(self.init_from) > 3,
                 "model.init_from", f"must be '' or hf:DIR (a Hugging Face directory), got {self.init_from!r}")
        _require(self.init_std > 0, "model.init_std", "must be > 0")
        _require(self.norm_eps > 0, "model.norm_eps", f"must be > 0 (RMSNorm divides by sqrt(mean + eps)), got "
                                                      f"{self.norm_eps}")
        # A mixer's section is checked against the model only when a layer uses that mixer.
        _require(not self._uses("atlas") or self.atlas.poly_degree == 1 or self.atlas.poly_key_dim <= self.head_dim,
                 "model.atlas.poly_key_dim",
                 f"{self.atlas.poly_key_dim} exceeds the head dimension d_model / num_heads = {self.head_dim}")
        _require(self.kind == "looped" or self.attention.causal, "model.attention.causal",
                 "false (bidirectional) is for the looped model's blocks (model.looped.attention); a decoder LM "
                 "must be causal")
        _require(self.kind != "looped" or self.looped.positions == "rope" or self.d_model % 2 == 0,
                 "model.looped.positions",
                 f"rope+sinusoidal needs an even model.d_model (sine and cosine pairs), got {self.d_model}")
        if self.kind == "ahn":
            self._check_ahn()
        inner = self.mamba2.expand * self.d_model
        _require(not (self._uses("mamba2") or self._uses("muonssm_mamba2")) or not self.mamba2.head_dim
                 or inner % self.mamba2.head_dim == 0, "model.mamba2.head_dim",
                 f"{self.mamba2.head_dim} does not divide model.mamba2.expand * model.d_model = {inner}")

    def _check_ahn(self) -> None:
        """An AHN base is Transformer++ (every layer full causal attention); AHN runs its layers unscanned."""
        other = [name for name in self.mixers if name != "attention"] or [""]
        _require(not other[0], "model.ahn.base",
                 f"layers of mixer {other[0]!r}: the compressors reuse each layer's attention queries, keys and "
                 "values, so every layer of the base must be 'attention'")
        _require(not self.scan_layers, "model.scan_layers", "must be false for model.kind = ahn")
        _require(self.remat == "none", "model.remat", "must be none for model.kind = ahn (its layers are not "
                                                      "rematerialised)")
        _require(self.attention.conv_kernel == 0 and not self.attention.qk_norm, "model.ahn.base",
                 "the base's attention has a short convolution or q/k norm; AHN takes a Llama / Qwen2 layout")

    @property
    def mixers_in_use(self) -> tuple[str, ...]:
        """The registered mixers the model builds: ``mixers`` of an LM, the looped block's ``looped.mixer``."""
        return (self.looped.mixer,) if self.kind == "looped" else self.mixers

    def _uses(self, family: str) -> bool:
        """A layer uses a mixer named ``family`` or ``family_*`` (``atlas`` covers ``atlas_mag``, ``atlas_mal``)."""
        return any(name == family or name.startswith(family + "_") for name in self.mixers_in_use)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def attention_head_dim(self) -> int:
        """Width of an attention head: ``model.attention.head_dim``, or ``d_model / num_heads`` when 0."""
        return self.attention.head_dim or self.head_dim

    @property
    def mlp_hidden(self) -> int:
        if self.d_ff:
            return self.d_ff
        return -(-(8 * self.d_model // 3) // 64) * 64


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

    def __post_init__(self):
        _require_at_least(self, "train", steps=1, batch_size=1, grad_accum=1)
        _require(self.batch_size % self.grad_accum == 0, "train.batch_size",
                 f"{self.batch_size} is not divisible by train.grad_accum={self.grad_accum}")
        _require(0 <= self.exit_at_step <= self.steps, "train.exit_at_step",
                 f"must be in [0, train.steps={self.steps}], got {self.exit_at_step}")
        _require(bool(self.run_dir), "train.run_dir", "must not be empty")
        _require(self.guard_steps >= 0, "train.guard_steps", f"must be >= 0, got {self.guard_steps}")
        _require(self.guard_sigma > 0, "train.guard_sigma", f"must be > 0, got {self.guard_sigma}")


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh. Sizes multiply to the device count; one of them may be -1 (fill)."""

    data: int = describe("data-parallel axis size (-1 = all remaining devices)", -1)
    fsdp: int = describe("fully-sharded data-parallel axis size (parameters sharded, batch split)", 1)
    tensor: int = describe("tensor-parallel axis size (heads / MLP hidden / vocab split)", 1)
    dcn_data: int = describe("of mesh.data, how many ways are across slices / hosts (DCN); the rest is within "
                             "a slice (ICI)", 1)
    dcn_fsdp: int = describe("of mesh.fsdp, how many ways are across slices / hosts (DCN)", 1)
    dcn_tensor: int = describe("of mesh.tensor, how many ways are across slices / hosts (DCN); keep 1", 1)

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        _require(all(s == -1 or s >= 1 for s in sizes), "mesh", f"sizes must be >= 1 or -1, got {sizes}")
        _require(sizes.count(-1) <= 1, "mesh", f"at most one size may be -1, got {sizes}")
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
