"""``model``: the keys of the model section that belong to no mixer (widths, depth, dtypes, the kind).

``seqmodels.config.ModelConfig`` is ``ModelConfigBase`` plus one field per config section registered
with the mixer registry (``model.attention``, ``model.atlas``, ...: each defined beside its mixer under
``seqmodels/mixers/``). Mixers and layers take their config by this name, ``ModelConfigBase``, since
``seqmodels.config`` imports them to assemble ``ModelConfig``; what they receive is a ``ModelConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seqmodels.config_ahn import AHNConfig
from seqmodels.config_base import (MAX_FF, MAX_TOKENS, MAX_VOCAB, MAX_WIDTH, KernelImpl, _require, _require_at_least,
                                   _require_at_most, _require_choices, describe)
from seqmodels.config_looped import LoopedConfig


@dataclass(frozen=True)
class ModelConfigBase:
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
    kind: Literal["lm", "looped", "ahn"] = describe(
        "lm (decoder LM over model.mixers) | looped (looped padded transformer, model.looped) | ahn (a frozen "
        "base with sliding-window attention and a compressor per layer, model.ahn)", "lm")
    looped: LoopedConfig = describe("looped padded transformer settings", factory=LoopedConfig)
    ahn: AHNConfig = describe("AHN settings (model.kind = ahn)", factory=AHNConfig)
    init_from: str = describe(
        "'' (random initialisation) | hf:DIR: a Hugging Face Llama / Qwen2 directory (seqmodels.hf) whose "
        "architecture becomes this model section and whose weights start the run", "")

    def __post_init__(self):
        """The keys above; each mixer section checks itself against them (``seqmodels.config.ModelConfig``)."""
        if type(self) is ModelConfigBase:
            raise TypeError("ModelConfigBase is the model section without its mixers' sections; build "
                            "seqmodels.config.ModelConfig")
        _require_choices(self, "model")
        _require_at_least(self, "model", vocab_size=1, d_model=1, num_heads=1, max_seq_len=1, d_ff=0)
        _require_at_most(self, "model", vocab_size=MAX_VOCAB, d_model=MAX_WIDTH, num_heads=MAX_WIDTH,
                         max_seq_len=MAX_TOKENS, d_ff=MAX_FF)
        _require(self.d_model % self.num_heads == 0, "model.d_model",
                 f"{self.d_model} is not divisible by model.num_heads={self.num_heads}")
        _require(len(self.mixers) >= 1, "model.mixers", "needs at least one layer")
        _require(self.init_from == "" or self.init_from.startswith("hf:") and len(self.init_from) > 3,
                 "model.init_from", f"must be '' or hf:DIR (a Hugging Face directory), got {self.init_from!r}")
        _require(self.init_std > 0, "model.init_std", "must be > 0")
        _require(self.norm_eps > 0, "model.norm_eps", f"must be > 0 (RMSNorm divides by sqrt(mean + eps)), got "
                                                      f"{self.norm_eps}")
        _require(self.kind != "looped" or self.looped.positions == "rope" or self.d_model % 2 == 0,
                 "model.looped.positions",
                 f"rope+sinusoidal needs an even model.d_model (sine and cosine pairs), got {self.d_model}")
        if self.kind == "ahn":
            self._check_ahn()

    def _check_ahn(self) -> None:
        """An AHN base is Transformer++ (every layer full causal attention); AHN runs its layers unscanned."""
        other = [name for name in self.mixers if name != "attention"] or [""]
        _require(not other[0], "model.ahn.base",
                 f"layers of mixer {other[0]!r}: the compressors reuse each layer's attention queries, keys and "
                 "values, so every layer of the base must be 'attention'")
        _require(not self.scan_layers, "model.scan_layers", "must be false for model.kind = ahn")
        _require(self.attention.conv_kernel == 0 and not self.attention.qk_norm, "model.ahn.base",
                 "the base's attention has a short convolution or q/k norm; AHN takes a Llama / Qwen2 layout")

    @property
    def mixers_in_use(self) -> tuple[str, ...]:
        """The registered mixers the model builds: ``mixers`` of an LM, the looped block's ``looped.mixer``."""
        return (self.looped.mixer,) if self.kind == "looped" else self.mixers

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
