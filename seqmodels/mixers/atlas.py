"""Atlas: a long-term memory that learns, at test time, to memorise a window of its context.

Follows Behrouz et al., "ATLAS: Learning to Optimally Memorize the Context at Test Time" (2025).
Per head h (head dimension ``D = d_model / H`` for keys, queries and values), for each token t:

    q_t, k_t, v_t = silu(conv(W_q x)), silu(conv(W_k x)), silu(conv(W_v x))      short causal conv
    q_t, k_t      <- q_t / ||q_t||, k_t / ||k_t||
    alpha_t, theta_t, eta_t, gamma_t = lo + (hi - lo) sigmoid(w . x_t + bias)     one map per gate
                                                     (bias_alpha starts at 3, the others at 0)
    G_t = sum_{i=t-c+1}^{t} gamma_i clip_tau(grad_M || M(phi(k_i)) - v_i ||^2)     Omega rule, window c
    S_t = theta_t S_{t-1} - G_t                                                    momentum
    M_t = alpha_t M_{t-1} + eta_t NS_k(S_t)                                        k Newton-Schulz steps
    (eta_scales = gradient:  S_t = theta_t S_{t-1} - eta_t G_t,  M_t = alpha_t M_{t-1} + NS_k(S_t))
    y_t = W_o concat_h( RMSNorm(M_t(phi(q_t))) * silu(W_g x_t) )

``phi`` is the polynomial feature map of degree p (``feature_map`` below: ``F = D + sum_{i=2..p} R^i``
features, learnable per-degree coefficients initialised to 1/i!), ``M`` a matrix ``[F, D]``
(``memory_depth = 1``) or a 2-layer MLP with residual ``phi[:D] + silu(phi W1) W2``
(``memory_depth = 2``, hidden ``E = memory_expansion * D``), starting every document from the
learnable ``M_0``; ``NS_0`` is the identity. With ``memory_norm`` the branch is layer-normalised
with a learned per-head gain ``g [H, D]`` (initialised to 1) and the residual is added at either
depth, ``M(phi) = phi[:D] + g * LN(phi W)`` or ``phi[:D] + g * LN(silu(phi W1) W2)``: the Titans
reference code's ``ResidualNorm`` (titans-pytorch: ``LayerNorm(MLP(x)) + x``, LayerNorm without
bias, gain ``1 + g``); its one departure, ``g`` an outer parameter rather than a memory weight, and
why: ``pallas_kernels/atlas_memory/memory.py``. It is not in the Titans or Atlas papers' memory
equations (``memory_norm: false``, the default, is the Atlas paper's memory). The linear ``M_0`` starts at 0 without the norm and,
with it, from a random ``N(0, 1/F)`` (LayerNorm of a zero branch has no direction). ``clip_tau(g) = g min(1, tau / ||g||)`` bounds each
token's gradient (its norm over all weight matrices; ``tau = grad_clip``, 0 = no clipping). Exactly
how the gradients are taken in chunks of ``b`` tokens (at the memory of the chunk start), how the
window and the state stop at document boundaries, and how training (chunk-parallel) and decoding
(token by token) compute it: the op ``pallas_kernels.atlas_memory`` (``impl=model.kernel_impl``).

Newton-Schulz per chunk (``model.atlas.ns_granularity``, default ``token``: the paper's Eq. 32, NS_k of
every token's momentum, 97-99% of the FLOPs). ``chunk`` is a departure from the paper: per chunk of
b tokens (start memory ``M_s``, the window gradients and the momentum ``S_t`` as above), the tokens
read a linearised memory, the chunk-start memory plus the chunk's preceding and own updates with
``NS_k`` replaced by the identity, as TTT's dual form (Sun et al. 2024) reads its inner model:

    M~_t = alpha_t M~_{t-1} + eta_t S_t      M~_{s-1} = M_s          y_t = M~_t(phi(q_t))
    at the chunk's end e:  M_e = (prod_{t in chunk} alpha_t) M_s + c_e NS_k(S_e),   c_t = alpha_t c_{t-1} + eta_t

(``gradient``: ``eta_t`` -> 1 in both). That is the token rule's memory with every ``NS_k(S_t)`` of the
chunk replaced by the one of its last momentum: one Newton-Schulz per chunk, b times fewer of its
FLOPs, the reason for the departure. With ``b = 1`` the memory is the token rule's (the read is not:
it takes ``eta_t S_t`` for ``eta_t NS_k(S_t)``). Decoding follows the same chunk grid over the
decoded stream: the cache keeps the position, the linearised read memory and the pending scale
``c``, and the token at a chunk's end runs ``NS_k``. Exact form: ``pallas_kernels.atlas_memory``.
Measured against the token rule at 2 seeds (``experiments/needle``, ``experiments/recall``, d_model 64, 2-core
CPU): at equal steps it learns slower (needle 0.57 / 0.47 / 0.36 at 1x / 2x / 4x against 1.00 / 0.87 /
0.61); at 5x the steps, in under the token rule's time, it is ahead (1.00 / 1.00 / 0.98; MQAR 0.88 against
0.14).

Special cases (``model.atlas``): **Titans** is ``window = 1, poly_degree = 1, ns_steps = 0``
(``configs/titans.yaml``); **OmegaNet** is ``ns_steps = 0`` with ``window > 1``.

Context parallelism (``mesh.context = C``). The memory update is nonlinear across chunks (gradients at
the memory itself, Newton-Schulz), so the C shards of a row run in sequence, shard c from the memory,
momentum and Omega window that shard c - 1 leaves (``seqmodels.layers.sequential_passing``); the short
conv takes a halo. Each device computes its shard once, but the layer's memory op takes C times one
shard's time (the whole row's on one device), with C state ppermutes per direction; the training run logs
it. ``T / C`` must be a multiple of ``chunk_size``, so the shards' chunks are the row's.

Diagnostics. Each call of the training forward sows (``nnx.Intermediate`` ``atlas_diagnostics``,
collected only under ``nnx.capture``; ``seqmodels.training.diagnostics``) scalars computed from its
own intermediates, without gradient: ``memory_norm`` (mean over rows and heads of ``||M_T||_F``,
all weight matrices together, ``M_T`` the memory after the row's last position), ``readout_ratio``
(``sum_t ||y_t|| / sum_t ||v_t||`` over the valid tokens and heads, ``y_t = M_t(phi(q_t))``) and the
means of the gates ``alpha``, ``theta``, ``eta``, ``gamma`` over the valid tokens and heads.

Notes. q, k, v and the output gate come from one matmul ``[d_model, H, 4, D]``; the depthwise
conv runs over the q, k, v channels together (the same as one conv each).

Where eta sits (``model.atlas.eta_scales``, default ``auto``). The paper's main text (Eq. 32, Table 1)
updates ``M_t = alpha_t M_{t-1} - eta_t NS_k(S_t)``: the step size multiplies the orthogonalised
momentum (``update``, how Muon applies its learning rate); ``auto`` takes it whenever ``k > 0``. With
``k > 0`` ``NS_k(S_t)`` has singular values near 1 whatever the scale of ``S_t``, so ``gradient``
(eta on the gradient entering the momentum) leaves ``eta_t`` only weighing the new window gradient
against the carried momentum: every token writes a unit-scale step whatever its error (on the needle
task such an Atlas stays at chance, ``experiments/needle/README.md``). With ``k = 0`` ``auto`` is
``gradient``, Titans' momentum ``S_t = theta_t S_{t-1} - eta_t G_t`` (the data-dependent learning
rate on the surprise), where eta is the inner learning rate under either placement. The sign: the
paper writes ``- eta NS_k(S)`` with ``S`` accumulating ``+G``; here ``S`` accumulates ``-G``, the same
update (NS_k is odd). The recurrence runs in float32; the Newton-Schulz matmuls, forward and
backward, take ``model.compute_dtype`` operands (bf16 with float32 accumulation; float32 exact).
``ns_coefficients`` picks the quintics: ``muon`` (the paper's Muon-style NS_k) or ``polar_express``
(Amsel et al., 2025: a different polynomial at each step, ``pallas_kernels/newton_schulz/coefficients.py``).

FLOPs per token (forward, one layer; 2 per multiply-add), with ``P = sum m n`` over the memory's
matrices (``F D`` linear; ``F E + E D`` deep):

    projections  2 d_model (4 H D) + 2 d_model (4 H) + 2 H D d_model        q, k, v, gate; gates; output
    per head     2 (2 P + [deep] 2 E D) (b + c - 1) / b     inner forward/backward at the chunk-start
                                             memory and at M_0, of the chunk's and the c - 1 carried tokens
               + (1 + [c > 1] 2) P (b + c - 1) / b     window sum: the rank-1 gradients as matrices,
                                             then a running sum (the entering term added, the leaving one
                                             subtracted)
               + k NS(F, D)  or  k (NS(F, E) + NS(E, D))    Newton-Schulz (deep: W1 and W2, each at its shape)
               + 2 P                         read-out
               + [norm] 20 D (b + c - 1) / b + 8 D    LayerNorm forward and backward (~10 D) at both
                                             base memories, LayerNorm of the read-out
    NS(m, n) = 4 s^2 l + 2 s^3  with s = min(m, n), l = max(m, n)             one Newton-Schulz step

    ns_granularity = chunk (the dual form, ``w = b + c - 1`` window tokens per chunk): the inner and
    norm terms as above, and in place of the window sum, Newton-Schulz and read-out lines
               + 3 (2 P) + sum_j 2 (m_j + n_j) w + 4 b w     reads: x W at M_s, M_0 and S_carry; the
                                             factor scores and their products; the [b, b] x [b, w] coefficients
               + (2 P w + k NS) / b          the chunk's end: S_end from the factors, one Newton-Schulz
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.atlas_memory import (AtlasInputs, AtlasSettings, MemoryLayout, atlas_memory, atlas_memory_step,
                                         init_state)

from seqmodels.config_base import NsCoefficients, _require, _require_at_least, _require_choices, describe
from seqmodels.config_model import ModelConfigBase
from seqmodels.layers.common import Dense, DenseOut, constant_param, param
from seqmodels.layers.context import sequence_is_split
from seqmodels.layers.conv import ShortConv
from seqmodels.layers.norms import RMSNorm
from seqmodels.layers.sequential_passing import split_atlas_memory
from seqmodels.mixers.registry import register, register_section
from seqmodels.sharding import constrain, kernel_spec


@dataclass(frozen=True)
class AtlasConfig:
    """``model.atlas``: the ``atlas`` memory mixer (and the memory branch of ``atlas_mag`` / ``atlas_mal``)."""

    window: int = describe("Omega-rule window c: tokens whose losses each memory update optimises (1 = Titans)", 8)
    chunk_size: int = describe("chunk b of the parallel form: gradients are taken at the memory of the chunk start",
                               16)
    poly_degree: int = describe("degree p of the polynomial feature map of keys and queries (1 = identity)", 2)
    poly_key_dim: int = describe("key coordinates entering the degree >= 2 features (their count is r^i)", 8)
    ns_steps: int = describe("Newton-Schulz steps k applied to the momentum (0 = off: plain momentum)", 5)
    ns_coefficients: NsCoefficients = describe(
        "Newton-Schulz polynomial schedule: muon (Muon's quintic (3.4445, -4.7750, 2.0315) every step) | "
        "polar_express (the per-step minimax schedule of Amsel et al. 2025, arXiv:2505.16932, Algorithm 1)", "muon")
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
    ns_granularity: Literal["token", "chunk"] = describe(
        "where Newton-Schulz runs: token (NS_k of every token's momentum, M_t = alpha M_{t-1} + eta NS_k(S_t): the "
        "paper's Eq. 32) | chunk (a departure: NS_k once per chunk of the momentum at the chunk's end, "
        "M <- A M + c NS_k(S_end); the chunk's tokens read the chunk-start memory plus the linearised updates "
        "eta S_t that precede them, TTT's dual form; b-times fewer Newton-Schulz FLOPs)", "token")
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

    def check_model(self, model: ModelConfigBase) -> None:
        """The degree >= 2 features take ``poly_key_dim`` of a head's ``d_model / num_heads`` key coordinates."""
        _require(self.poly_degree == 1 or self.poly_key_dim <= model.head_dim, "model.atlas.poly_key_dim",
                 f"{self.poly_key_dim} exceeds the head dimension d_model / num_heads = {model.head_dim}")

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


register_section("atlas", AtlasConfig, "Atlas / Titans memory settings")


GATES = ("alpha", "theta", "eta", "gamma")
# Initial bias of each gate's logit: alpha starts at 0.953 of its range (0.995 for [0.9, 1], a
# retention horizon of ~200 tokens, so the memory does not forget a document's start before it
# has learnt what to keep); theta, eta and gamma start at the middle of their ranges.
GATE_INITIAL_LOGITS = (3.0, 0.0, 0.0, 0.0)


def feature_dim(key_dim: int, degree: int, poly_key_dim: int) -> int:
    """``F = K + sum_{i=2..p} R^i``."""
    return key_dim + sum(poly_key_dim**i for i in range(2, degree + 1))


def initial_coefficients(degree: int) -> jax.Array:
    """``[1/1!, 1/2!, ..., 1/p!]``."""
    return jnp.asarray([1.0 / math.factorial(i) for i in range(1, degree + 1)], jnp.float32)


def feature_map(keys: jax.Array, coefficients: jax.Array | None, poly_key_dim: int) -> jax.Array:
    """``phi(keys)``: keys ``[..., H, K]``, coefficients ``[H, p]`` (None: p = 1, identity) -> ``[..., H, F]``."""
    if coefficients is None:
        return keys
    degree = coefficients.shape[-1]
    reduced = keys[..., :poly_key_dim]
    blocks, power = [coefficients[:, 0:1] * keys], reduced
    for i in range(2, degree + 1):
        power = (power[..., :, None] * reduced[..., None, :]).reshape(*keys.shape[:-1], -1)
        blocks.append(coefficients[:, i - 1:i] * power)
    return jnp.concatenate(blocks, axis=-1)


def memory_layout(config: ModelConfigBase) -> MemoryLayout:
    atlas, head_dim = config.atlas, config.head_dim
    features = feature_dim(head_dim, atlas.poly_degree, atlas.poly_key_dim)
    hidden = atlas.memory_expansion * head_dim if atlas.memory_depth == 2 else 0
    return MemoryLayout(features, head_dim, hidden, norm=atlas.memory_norm)


def atlas_settings(config: ModelConfigBase) -> AtlasSettings:
    atlas = config.atlas
    return AtlasSettings(memory_layout(config), window=atlas.window, chunk_size=atlas.chunk_size,
                         ns_steps=atlas.ns_steps, ns_coefficients=atlas.ns_coefficients, ns_dtype=config.compute_dtype,
                         grad_clip=atlas.grad_clip, eta_scales=atlas.eta_rule, ns_granularity=atlas.ns_granularity)


def _unit(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + 1e-6)


def memory_diagnostics(inputs: AtlasInputs, y: jax.Array, final_memory: tuple) -> dict[str, jax.Array]:
    """The layer's diagnostics (module docstring) as float32 scalars, without gradient.

    ``inputs`` of the recurrence, its outputs ``y [B, T, H, D]`` and ``final_memory`` (one
    ``[B, H, m, n]`` per weight matrix).
    """
    valid = (inputs.segment_ids != 0).astype(jnp.float32)[..., None]  # [B, T, 1], broadcast over heads
    tokens = jnp.maximum(jnp.sum(valid) * inputs.eta.shape[-1], 1.0)
    memory_sq = sum(jnp.sum(jnp.square(w), axis=(-2, -1)) for w in final_memory)  # [B, H]
    readout = jnp.sum(jnp.linalg.norm(y, axis=-1) * valid)
    values = jnp.sum(jnp.linalg.norm(inputs.values, axis=-1) * valid)
    diagnostics = {"memory_norm": jnp.mean(jnp.sqrt(memory_sq)),
                   "readout_ratio": readout / jnp.maximum(values, 1e-12),
                   **{gate: jnp.sum(getattr(inputs, gate) * valid) / tokens for gate in GATES}}
    return jax.tree.map(jax.lax.stop_gradient, diagnostics)


class Atlas(nnx.Module):
    """The Atlas memory mixer (module docstring); ``x [B, T, d_model] -> (y [B, T, d_model], cache)``."""

    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        atlas, heads, head_dim, d_model = config.atlas, config.num_heads, config.head_dim, config.d_model
        std = config.init_std
        self.settings, self.impl = atlas_settings(config), config.kernel_impl
        self.poly_key_dim = atlas.poly_key_dim
        self.ranges = tuple(getattr(atlas, f"{name}_range") for name in GATES)

        # q, k, v and the output gate in one matmul; one short conv over the q, k, v channels.
        self.projection = Dense(d_model, (heads, 4, head_dim), "embed", ("heads", None, "head_dim"), rngs=rngs, std=std)
        self.conv = ShortConv(3 * heads * head_dim, atlas.conv_size, rngs=rngs)
        self.gates = Dense(d_model, (heads, len(GATES)), "embed", ("heads", None), rngs=rngs, std=std, use_bias=True)
        self.gates.bias.set_value(jnp.broadcast_to(jnp.asarray(GATE_INITIAL_LOGITS), (heads, len(GATES))))
        self.poly_coefficients = None if atlas.poly_degree == 1 else constant_param(
            jnp.broadcast_to(initial_coefficients(atlas.poly_degree), (heads, atlas.poly_degree)), ("heads", None))
        layout = self.settings.layout
        if layout.deep or layout.norm:
            self.initial_memory = nnx.List([
                param(rngs, (heads, m, n), ("heads", None, None), std=m**-0.5) for m, n in layout.shapes])
        else:
            self.initial_memory = nnx.List([constant_param(jnp.zeros((heads, *layout.shapes[0])),
                                                           ("heads", None, None))])
        self.memory_gain = constant_param(jnp.ones((heads, head_dim)), ("heads", "head_dim")) if layout.norm else None
        self.out_norm = RMSNorm(head_dim, eps=config.norm_eps, axis_name="head_dim")
        self.out = DenseOut((heads, head_dim), d_model, ("heads", "head_dim"), "embed", rngs=rngs, std=std)

    def _qkv(self, x, segment_ids, conv_cache):
        """Unit queries and keys, values ``[B, T, H, D]`` (float32), output gate, conv cache."""
        projected = self.projection(x)  # [B, T, H, 4, D]: q, k, v, output gate of each head
        qkv = projected[:, :, :, :3]
        mixed, conv_cache = self.conv(qkv.reshape(*x.shape[:2], -1), segment_ids=segment_ids, cache=conv_cache)
        mixed = jax.nn.silu(mixed.astype(jnp.float32)).reshape(qkv.shape)
        q, k, v = (constrain(mixed[:, :, :, i], ("batch", "seq", "heads", "head_dim")) for i in range(3))
        return _unit(q), _unit(k), v, projected[:, :, :, 3], conv_cache

    def _inputs(self, x, segment_ids, conv_cache):
        q, k, v, output_gate, conv_cache = self._qkv(x, segment_ids, conv_cache)
        gates = jax.nn.sigmoid(self.gates(x).astype(jnp.float32))
        alpha, theta, eta, gamma = (low + (high - low) * gates[..., i] for i, (low, high) in enumerate(self.ranges))
        coefficients = None if self.poly_coefficients is None else self.poly_coefficients.get_value()
        if segment_ids is None:
            segment_ids = jnp.ones(x.shape[:2], jnp.int32)
        gain = None if self.memory_gain is None else self.memory_gain.get_value()
        inputs = AtlasInputs(feature_map(k, coefficients, self.poly_key_dim), v,
                             feature_map(q, coefficients, self.poly_key_dim), alpha, theta, eta, gamma, segment_ids,
                             gain)
        return inputs, output_gate, conv_cache

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        if cache is not None:
            segment_ids = None  # decoding continues one document
        inputs, output_gate, conv_cache = self._inputs(x, segment_ids, None if cache is None else cache["conv"])
        initial = tuple(w.get_value() for w in self.initial_memory)
        run = dict(impl=self.impl, partition_spec=kernel_spec(("batch", None, "heads", None), inputs.phi_k.shape))
        if cache is None:
            if sequence_is_split(x.shape[1]):  # shards in sequence: seqmodels.layers.sequential_passing
                y, final_memory = split_atlas_memory(inputs, initial, self.settings, impl=self.impl)
            else:
                y, final_memory = atlas_memory(inputs, initial, self.settings, return_memory=True, **run)
            self.sow(nnx.Intermediate, "atlas_diagnostics", memory_diagnostics(inputs, y, final_memory),
                     capture_noop=True)
        else:
            state, y = atlas_memory_step(cache["memory"], inputs, initial, self.settings, **run)
            cache = {"conv": conv_cache, "memory": state}
        y = constrain(y, ("batch", "seq", "heads", "head_dim"))
        y = self.out_norm(y.astype(x.dtype), gate=output_gate)
        return self.out(y), cache

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        """The conv history ``[B, conv_size - 1, 3 H D]`` and the recurrent state (float32); ``max_len`` is unused."""
        _, heads, _, head_dim = self.projection.kernel.get_value().shape
        initial = tuple(w.get_value() for w in self.initial_memory)
        return {"conv": self.conv.init_cache(batch_size, 3 * heads * head_dim, dtype),
                "memory": init_state(batch_size, initial, self.settings)}


def newton_schulz_step_flops(m: int, n: int) -> int:
    small, large = min(m, n), max(m, n)
    return 4 * small * small * large + 2 * small**3


def memory_flops_per_token(settings: AtlasSettings) -> float:
    """Forward FLOPs per token and head of the recurrence (the ``per head`` lines of the module docstring)."""
    layout = settings.layout
    size = layout.size
    backward = 2 * layout.hidden_dim * layout.value_dim if layout.deep else 0
    # Every chunk evaluates its b tokens and the c - 1 carried window tokens at its base memory.
    evaluated = (settings.chunk_size + settings.window - 1) / settings.chunk_size  # evaluations per token
    inner = 2 * (2 * size + backward) * evaluated
    window = (1 + (2 if settings.window > 1 else 0)) * size * evaluated
    ns = sum(newton_schulz_step_flops(m, n) for m, n in layout.shapes)
    norm = 20 * layout.value_dim * evaluated + 8 * layout.value_dim if layout.norm else 0
    if settings.ns_granularity == "chunk":  # the dual form (module docstring): no per-token matrix
        span = settings.chunk_size + settings.window - 1
        reads = 3 * 2 * size + sum(2 * (m + n) * span for m, n in layout.shapes) + 4 * settings.chunk_size * span
        chunk_end = (2 * size * span + settings.ns_steps * ns) / settings.chunk_size
        return inner + reads + chunk_end + norm
    return inner + window + settings.ns_steps * ns + 2 * size + norm


def atlas_flops(config: ModelConfigBase, seq_len: int) -> float:
    """Forward FLOPs per token of one ``atlas`` layer (module docstring); independent of ``seq_len``."""
    heads, head_dim, d_model = config.num_heads, config.head_dim, config.d_model
    projections = 2 * d_model * 4 * heads * head_dim + 2 * d_model * 4 * heads + 2 * heads * head_dim * d_model
    return projections + heads * memory_flops_per_token(atlas_settings(config))


# The split form (seqmodels.layers.sequential_passing): the shards' memory ops run one after another.
CONTEXT_NOTE = ("runs the Atlas memory's {context} shards in sequence, each from the state the previous one "
                "leaves ({context}x one shard's memory-op time per layer, {context} state ppermutes)")
register("atlas", lambda config, rngs: Atlas(config, rngs=rngs), atlas_flops, sections=("atlas",),
         context_parallel=True, context_note=CONTEXT_NOTE)
