"""Configuration sections of the mixers and of the looped model: every mixer's section lives here.

``model.attention``, ``model.swa``, ``model.mamba2``, ``model.longhorn``, ``model.deltanet``, ``model.muonssm``,
``model.atlas`` and ``model.looped``; each validates its values in ``__post_init__`` and raises
``ConfigError`` naming the field (a ``Literal[...]`` field by its type). They are sections of
``seqmodels.config.ModelConfig`` and are re-exported there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seqmodels.config_base import _require, _require_at_least, _require_choices, describe

NsCoefficients = Literal["muon", "polar_express"]  # Newton-Schulz polynomial schedules (pallas_kernels.newton_schulz)


def _is_chunk_size(value: int) -> bool:
    return value >= 16 and value & (value - 1) == 0


@dataclass(frozen=True)
class AttentionConfig:
    """Settings shared by the attention mixers (``attention`` and ``swa``)."""

    num_kv_heads: int = describe("key/value heads (grouped-query attention); 0 = model.num_heads", 0)
    head_dim: int = describe("width of each query/key/value head; 0 = model.d_model / model.num_heads", 0)
    qkv_bias: bool = describe("learned biases on the query, key and value projections (Qwen2)", False)
    rope_theta: float = describe("rotary embedding base", 10000.0)
    qk_norm: bool = describe("RMS-normalise queries and keys per head before the dot product", False)
    implementation: Literal["auto", "xla", "cudnn", "splash", "flash", "banded"] = describe(
        "attention kernel over training rows: auto (splash on TPU; on GPU cuDNN for rows without segment ids, "
        "else flash; banded for swa with sinks on TPU and GPU; xla where none applies and on CPU), xla "
        "(explicit [T, T] mask), cudnn, splash (TPU), flash (Pallas Triton with segment ids, GPU), banded "
        "(sliding window + sinks in linear memory, plain XLA, swa only); splash and flash run in interpret "
        "mode on CPU", "auto")
    conv_kernel: int = describe("width of a short causal depthwise convolution over q, k, v; 0 = none", 0)
    causal: bool = describe("causal (a query sees keys up to itself) or bidirectional (every key of its segment); "
                            "the looped model sets it from model.looped.attention", True)

    def __post_init__(self):
        _require_choices(self, "model.attention")
        _require(self.num_kv_heads >= 0, "model.attention.num_kv_heads", "must be >= 0")
        _require(self.head_dim >= 0 and self.head_dim % 2 == 0, "model.attention.head_dim",
                 f"must be 0 or a positive even width (RoPE rotates pairs), got {self.head_dim}")
        _require(self.conv_kernel >= 0, "model.attention.conv_kernel", f"must be >= 0, got {self.conv_kernel}")
        _require(self.rope_theta > 0, "model.attention.rope_theta", "must be > 0")


@dataclass(frozen=True)
class SlidingWindowConfig:
    """The ``swa`` mixer: causal attention over the last ``window`` tokens plus ``num_sinks`` sink tokens."""

    window: int = describe("tokens each query sees, itself included", 256)
    num_sinks: int = describe("first tokens of each document every query also sees (attention sinks)", 0)

    def __post_init__(self):
        _require_at_least(self, "model.swa", window=1, num_sinks=0)


@dataclass(frozen=True)
class Mamba2Config:
    """The ``mamba2`` mixer (and the backbone of ``muonssm_mamba2``): SSD with a scalar decay per head."""

    state_dim: int = describe("N: state width per channel (the width of B_t and C_t)", 64)
    expand: int = describe("inner width = expand * d_model, split into heads of head_dim channels", 2)
    head_dim: int = describe("P: channels per head; 0 = expand * d_model / model.num_heads", 0)
    conv_kernel: int = describe("width of the short causal depthwise convolution over x, B, C", 4)
    chunk_size: int = describe("tokens per chunk of the chunked training form (power of two >= 16)", 64)
    dt_min: float = describe("smallest initial step size Delta (log-uniform initialisation)", 1e-3)
    dt_max: float = describe("largest initial step size Delta", 1e-1)
    gated_norm: Literal["after_gate", "per_head_before_gate"] = describe(
        "output norm: after_gate (the reference Mamba2, norm_before_gate=False with one group: "
        "RMSNorm(y * SiLU(z)) over all H * P channels, one [H * P] scale) | per_head_before_gate "
        "(RMSNorm(y) * SiLU(z) per head with one shared [P] scale, as Gated DeltaNet; the rule of "
        "checkpoints saved before the reference became the default)", "after_gate")

    def __post_init__(self):
        _require_choices(self, "model.mamba2")
        _require_at_least(self, "model.mamba2", state_dim=1, expand=1, conv_kernel=1, head_dim=0)
        _require(_is_chunk_size(self.chunk_size), "model.mamba2.chunk_size",
                 f"must be a power of two >= 16, got {self.chunk_size}")
        _require(0 < self.dt_min <= self.dt_max, "model.mamba2.dt_min",
                 f"need 0 < dt_min <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")


@dataclass(frozen=True)
class LonghornConfig:
    """The ``longhorn`` mixer (and the backbone of ``muonssm_longhorn``): per-channel online regression."""

    state_dim: int = describe("N: state width per channel (the width of k_t and q_t)", 16)
    expand: int = describe("channels D = expand * d_model", 2)
    conv_kernel: int = describe("width of the short causal depthwise convolution over the input u", 4)
    dt_rank: int = describe("R: rank of the step-size projection; 0 = ceil(d_model / 16)", 0)
    dt_min: float = describe("smallest initial step size sigmoid(t_bias) (log-uniform initialisation)", 1e-3)
    dt_max: float = describe("largest initial step size sigmoid(t_bias), < 1", 1e-1)

    def __post_init__(self):
        _require_at_least(self, "model.longhorn", state_dim=1, expand=1, conv_kernel=1, dt_rank=0)
        _require(0 < self.dt_min <= self.dt_max < 1, "model.longhorn.dt_min",
                 f"need 0 < dt_min <= dt_max < 1, got dt_min={self.dt_min}, dt_max={self.dt_max}")


@dataclass(frozen=True)
class DeltaNetConfig:
    """The ``deltanet`` and ``gated_deltanet`` mixers (and the backbone of ``muonssm_gated_deltanet``)."""

    head_dim: int = describe("K: query/key width per head; 0 = d_model / model.num_heads", 0)
    value_head_dim: int = describe("V: value width per head; 0 = the key width K", 0)
    conv_kernel: int = describe("width of the short causal depthwise convolution over q, k, v", 4)
    chunk_size: int = describe("tokens per chunk of the chunked training form (power of two >= 16)", 64)

    def __post_init__(self):
        _require_at_least(self, "model.deltanet", head_dim=0, value_head_dim=0, conv_kernel=1)
        _require(_is_chunk_size(self.chunk_size), "model.deltanet.chunk_size",
                 f"must be a power of two >= 16, got {self.chunk_size}")


@dataclass(frozen=True)
class MuonSSMConfig:
    """MuonSSM: momentum over Newton-Schulz-conditioned injections, ``M_t = gamma M_{t-1} + tau NS_k(U_t)``."""

    gamma: float = describe("momentum decay gamma in [0, 1); 0 = no momentum", 0.9)
    tau: float = describe("scale tau > 0 of the conditioned injection", 1.0)
    ns_steps: int = describe("k: Newton-Schulz steps on each injection U_t; 0 = U_t unchanged", 1)
    ns_coefficients: NsCoefficients = describe("Newton-Schulz polynomial schedule", "muon")
    ns_eps: float = describe("epsilon of the Newton-Schulz input normalisation U / (||U||_F + eps)", 1e-7)
    ns_scope: Literal["all", "head"] = describe(
        "the matrix Newton-Schulz conditions per token: all (the MuonSSM code: one injection over every channel, "
        "[D, N] with the key shared by all heads in mamba2 / longhorn, block-diagonal over heads in "
        "gated_deltanet) | head (each head's [N, P] block on its own)", "all")

    def __post_init__(self):
        _require_choices(self, "model.muonssm")
        _require(0.0 <= self.gamma < 1.0, "model.muonssm.gamma", f"must be in [0, 1), got {self.gamma}")
        _require(self.tau > 0, "model.muonssm.tau", f"must be > 0, got {self.tau}")
        _require(self.ns_steps >= 0, "model.muonssm.ns_steps", f"k must be >= 0, got {self.ns_steps}")
        _require(self.ns_eps > 0, "model.muonssm.ns_eps", f"must be > 0, got {self.ns_eps}")


@dataclass(frozen=True)
class AtlasConfig:
    """The ``atlas`` memory mixer (and the memory branch of ``atlas_mag`` / ``atlas_mal``); see mixers/atlas.py."""

    window: int = describe("Omega-rule window c: tokens whose losses each memory update optimises (1 = Titans)", 8)
    chunk_size: int = describe("chunk b of the parallel form: gradients are taken at the memory of the chunk start",
                               16)
    poly_degree: int = describe("degree p of the polynomial feature map of keys and queries (1 = identity)", 2)
    poly_key_dim: int = describe("key coordinates entering the degree >= 2 features (their count is r^i)", 8)
    ns_steps: int = describe("Newton-Schulz steps k applied to the momentum (0 = off: plain momentum)", 5)
    ns_coefficients: NsCoefficients = describe("Newton-Schulz polynomial schedule", "muon")
    memory_depth: int = describe("memory: 1 = a matrix (linear), 2 = a 2-layer MLP with a residual", 2)
    memory_expansion: int = describe("hidden width of the MLP memory, in multiples of the head dimension", 2)
    memory_norm: bool = describe(
        "LayerNorm the memory's branch with a learned per-head gain and add the residual: M(phi) = phi[:D] + "
        "g * LN(MLP(phi)) (the Titans reference code's ResidualNorm; the gain is an outer parameter)", False)
    conv_size: int = describe("short causal convolution over q, k, v (1 = pointwise)", 4)
    alpha_range: tuple[float, ...] = describe("[low, high] of the memory retention gate alpha_t, within [0, 1]",
                                              factory=lambda: (0.9, 1.0))
    theta_range: tuple[float, ...] = describe("[low, high] of the momentum gate theta_t, within [0, 1]",
                                              factory=lambda: (0.0, 0.5))
    eta_range: tuple[float, ...] = describe(
        "[low, high] of the inner learning rate eta_t, >= 0; with ns_steps = 0 a token's loss moves a linear "
        "memory by ~2 eta gamma window of its error (unit keys): ~0.5 / window writes, far less barely does",
        factory=lambda: (0.0, 0.05))
    gamma_range: tuple[float, ...] = describe("[low, high] of the per-token window weight gamma_t, within [0, 1]",
                                              factory=lambda: (0.0, 1.0))
    eta_scales: Literal["auto", "gradient", "update"] = describe(
        "where eta_t enters: update (S_t = theta S - G, M_t = alpha M + eta NS_k(S_t): the Atlas paper's Eq. 32, "
        "Muon's learning rate) | gradient (S_t = theta S - eta G, M_t = alpha M + NS_k(S_t): Titans' momentum, "
        "where NS_k, scale-invariant, erases eta once ns_steps > 0) | auto: update when ns_steps > 0, else gradient "
        "(Titans' rule, the same memory as update for ns_steps = 0 up to where eta_t is applied)", "auto")
    grad_clip: float = describe(
        "tau: each token's inner gradient is scaled to norm <= tau before the window sum (0 = off). Bounds every "
        "memory update, so a chunk whose gradients overshoot (all taken at the chunk start) cannot blow up", 0.0)

    def __post_init__(self):
        _require_choices(self, "model.atlas")
        _require_at_least(self, "model.atlas", window=1, chunk_size=1, memory_expansion=1, conv_size=1,
                          poly_key_dim=1)
        _require(1 <= self.poly_degree <= 4, "model.atlas.poly_degree", f"must be in [1, 4], got {self.poly_degree}")
        _require(0 <= self.ns_steps <= 10, "model.atlas.ns_steps", f"must be in [0, 10], got {self.ns_steps}")
        _require(self.memory_depth in (1, 2), "model.atlas.memory_depth",
                 f"must be 1 (linear memory) or 2 (MLP memory), got {self.memory_depth}")
        _require(self.grad_clip >= 0, "model.atlas.grad_clip", f"must be >= 0 (0 = off), got {self.grad_clip}")
        for name, upper in (("alpha", 1.0), ("theta", 1.0), ("eta", None), ("gamma", 1.0)):
            self._check_range(name, upper)

    @property
    def eta_rule(self) -> str:
        """``eta_scales`` resolved: ``auto`` is ``update`` when ``ns_steps > 0`` (Newton-Schulz), else ``gradient``."""
        if self.eta_scales != "auto":
            return self.eta_scales
        return "update" if self.ns_steps > 0 else "gradient"

    def _check_range(self, name: str, upper: float | None) -> None:
        key, bounds = f"model.atlas.{name}_range", getattr(self, f"{name}_range")
        _require(len(bounds) == 2, key, f"must be [low, high], got {list(bounds)}")
        low, high = bounds
        _require(low <= high, key, f"is empty: low {low} > high {high}")
        allowed = "[0, inf)" if upper is None else f"[0, {upper}]"
        _require(low >= 0.0 and (upper is None or high <= upper), key, f"must lie within {allowed}, got {list(bounds)}")


@dataclass(frozen=True)
class LoopedConfig:
    """``model.kind: looped``: a prelude, ONE shared block applied ``loops(N)`` times, a coda, a read-out at [CLS]."""

    prelude_layers: int = describe("distinct blocks before the loop (0-2)", 1)
    coda_layers: int = describe("distinct blocks after the loop (0-2)", 1)
    loop_schedule: Literal["log", "fixed"] = describe(
        "log: loops(N) = ceil(loops_scale * log2 N) + loops_offset | fixed: fixed_loops", "log")
    loops_scale: float = describe("c in loops(N) = ceil(c log2 N) + d", 1.0)
    loops_offset: int = describe("d in loops(N) = ceil(c log2 N) + d", 1)
    fixed_loops: int = describe("loop count when loop_schedule = fixed", 4)
    share_weights: bool = describe(
        "one block looped (true), or fixed_loops distinct blocks: a fixed-depth baseline (false; loop_schedule fixed)",
        True)
    reinject: bool = describe("add the prelude output to the block input at every loop", True)
    padding_scale: float = describe("a in P(N) = ceil(a N^e) padding tokens before [CLS]; 0 = no padding", 0.0)
    padding_exponent: float = describe("e in P(N) = ceil(a N^e)", 1.0)
    attention: Literal["causal", "bidirectional"] = describe(
        "attention of every block over the padded layout", "bidirectional")
    positions: Literal["rope", "rope+sinusoidal"] = describe(
        "rope: positions enter only through RoPE in attention | rope+sinusoidal: also fixed sinusoidal features of "
        "the padded-layout position added to the embeddings (absolute positions in the residual stream)", "rope")
    mixer: str = describe("the registered mixer of the looped block (attention, gated_deltanet, ...)", "attention")

    def __post_init__(self):
        _require_choices(self, "model.looped")
        for key in ("prelude_layers", "coda_layers"):
            value = getattr(self, key)
            _require(0 <= value <= 2, f"model.looped.{key}", f"must be 0, 1 or 2, got {value}")
        _require_at_least(self, "model.looped", loops_scale=0, fixed_loops=1)
        _require(self.share_weights or self.loop_schedule == "fixed", "model.looped.share_weights",
                 "false (distinct blocks) needs model.looped.loop_schedule=fixed")
        _require_at_least(self, "model.looped", padding_scale=0, padding_exponent=0)

