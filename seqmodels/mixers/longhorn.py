"""LongHorn and MuonSSM-on-LongHorn: per-channel online-regression state spaces on ``linear_scan``.

LongHorn (Liu et al., "Longhorn: State Space Models are Amortized Online Learners", 2024) per
token ``t`` of the mixer input (``x``, ``[d_model]``), with ``D = expand * d_model`` channels and a
state of ``N`` per channel (one key and query shared by every channel)::

    u_t, z_t  = W_u x_t, W_z x_t                                      [D] each (z: output gate)
    u_t       <- SiLU(ShortConv(u))                                   causal depthwise, width conv_kernel
    k_t, q_t  = W_k u_t, W_q u_t                                      [N] each
    dt_t      = sigmoid(W_up W_down u_t + t_bias)                     [D], low rank R
    T_t       = dt_t / (1 + dt_t ||k_t||^2)                           [D]
    h_t       = (1 - T_t k_t^2) * h_{t-1} + (T_t u_t) k_t^T           [D, N] (k_t^2 elementwise, per n)
    y_t       = h_t q_t + D_skip * u_t,   out_t = W_out (y_t * SiLU(z_t))

``h_t`` is one closed-form step of online regression of ``u_t`` on ``k_t`` per channel; the
transition is diagonal, so the state is ``pallas_kernels.linear_scan`` over ``[B, T, D, N]``
(``a = 1 - T k^2`` in ``[0, 1)``, ``b = (T u) k^T``; ``impl = model.kernel_impl``).

``muonssm_longhorn`` (MuonSSM, its LongHorn code ``selective_scan_online_orth_fn``) keeps the
transition and passes the injection ``U_t = (T_t u_t) k_t^T`` through a velocity::

    V_t = gamma V_{t-1} + tau NS_k(U_t),   h_t = (1 - T_t k_t^2) * h_{t-1} + V_t

two diagonal scans. ``U_t`` is rank 1 over all channels, so ``NS_k(U_t) = r_k U_t`` with
``r_k = rank_one_scale(||T_t u_t||^2 ||k_t||^2)`` (``model.muonssm.ns_scope = all``, the code's
``[D, N]`` matrix); ``head`` conditions each of ``model.num_heads`` groups of ``D / H`` channels on
its own. ``gamma = 0, k = 0, tau = 1`` is LongHorn exactly.

Decoding runs the same scans one token at a time from the cache (conv inputs, ``state [B, D, N]``
and, for MuonSSM, ``velocity [B, D, N]``, float32). Packed rows: the convolution stops at document
boundaries and ``a`` (and the velocity's ``gamma``) is 0 at each document's first token. With the
sequence split over ``mesh.context`` the convolution takes a halo and each scan passes its state
between shards (``seqmodels.layers.state_passing.split_linear_scan``).

Departures from the published code: the output gate is ``y * SiLU(z)`` without the optional RMSNorm
(the code's path without ``norm_weight``); ``t_bias`` starts at ``logit(dt_0)``, ``dt_0``
log-uniform in ``[model.longhorn.dt_min, dt_max]`` (Mamba's step-size initialisation carried to the
sigmoid); the momentum reset at document starts is ours (the code has no packed rows).

FLOPs per token (forward, 2 per multiply-add; ``d`` = d_model, ``K`` = conv_kernel, ``R`` = dt rank):
projections ``2 d (2 D) + 2 D (2 N + R) + 2 R D + 2 D d``, convolution ``2 K D``, and the scan
``6 D N`` (forming ``a`` and ``b``, the update ``a h + b``, the read-out ``h q``); MuonSSM adds
``3 D N`` (the scaled injection and the velocity update).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.linear_scan import linear_scan
from pallas_kernels.momentum_scan import rank_one_scale

from seqmodels.config_base import _require, _require_at_least, describe
from seqmodels.config_model import ModelConfigBase
from seqmodels.layers.common import Dense, constant_param
from seqmodels.layers.context import sequence_is_split
from seqmodels.layers.conv import ShortConv
from seqmodels.layers.segments import document_starts
from seqmodels.layers.state_passing import split_linear_scan
from seqmodels.mixers.registry import register, register_section


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


register_section("longhorn", LonghornConfig, "LongHorn settings (longhorn, muonssm_longhorn)")


def longhorn_shape(config: ModelConfigBase) -> tuple[int, int, int]:
    """``(channels D, state_dim N, dt rank R)`` of the LongHorn mixers under ``config``."""
    settings = config.longhorn
    return settings.expand * config.d_model, settings.state_dim, settings.dt_rank or math.ceil(config.d_model / 16)


def _logit_dt_init(key, channels: int, dt_min: float, dt_max: float) -> jax.Array:
    unit = jax.random.uniform(key, (channels,), jnp.float32)
    dt = jnp.exp(unit * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return jnp.log(dt) - jnp.log1p(-dt)


class LongHorn(nnx.Module):
    """The LongHorn mixer (module docstring); ``x [B, T, d_model] -> (y [B, T, d_model], cache)``."""

    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        settings, std, width = config.longhorn, config.init_std, config.d_model
        channels, state_dim, rank = longhorn_shape(config)
        self.channels, self.state_dim, self.impl = channels, state_dim, config.kernel_impl
        self.in_proj = Dense(width, (2, channels), "embed", (None, "heads"), rngs=rngs, std=std)
        self.conv = ShortConv(channels, settings.conv_kernel, rngs=rngs, axis_name="heads")
        self.kq_proj = Dense(channels, (2, state_dim), "heads", (None, "state"), rngs=rngs, std=std)
        self.dt_down = Dense(channels, rank, "heads", None, rngs=rngs, std=std)
        self.dt_up = Dense(rank, channels, None, "heads", rngs=rngs, std=std)
        self.t_bias = constant_param(_logit_dt_init(rngs.params(), channels, settings.dt_min, settings.dt_max),
                                     ("heads",))
        self.skip = constant_param(jnp.ones((channels,)), ("heads",))
        self.out = Dense(channels, width, "heads", "embed", rngs=rngs, std=std)

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        """``x: [B, T, d_model]`` -> ``(y [B, T, d_model], cache)``; positions are not used (a recurrence)."""
        del positions
        u, z = jnp.moveaxis(self.in_proj(x), -2, 0)
        u, conv_cache = self.conv(u, segment_ids=segment_ids, cache=None if cache is None else cache["conv"])
        u = jax.nn.silu(u)
        k, q = (t.astype(jnp.float32) for t in jnp.moveaxis(self.kq_proj(u), -2, 0))
        dt = jax.nn.sigmoid(self.dt_up(self.dt_down(u)).astype(jnp.float32) + self.t_bias.get_value())
        step = dt / (1.0 + dt * jnp.sum(k * k, axis=-1, keepdims=True))  # T_t [B, T, D]
        keep = 1.0 - step[..., None] * (k * k)[:, :, None, :]  # [B, T, D, N]
        if segment_ids is not None:
            keep = jnp.where(document_starts(segment_ids)[..., None, None], 0.0, keep)
        written = step * u.astype(jnp.float32)  # T_t u_t [B, T, D]
        state, recurrent = self.recurrence(keep, written, k, segment_ids=segment_ids, cache=cache)
        y = jnp.einsum("btdn,btn->btd", state, q) + self.skip.get_value() * u.astype(jnp.float32)
        y = (y * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)
        new_cache = None if cache is None else {"conv": conv_cache, **recurrent}
        return self.out(y), new_cache

    def _scan(self, a, b, initial):
        if initial is None and sequence_is_split(b.shape[1]):
            return split_linear_scan(a, b, impl=self.impl)
        impl = "reference" if b.shape[1] == 1 else self.impl
        return linear_scan(a, b, initial=initial, impl=impl)

    def recurrence(self, keep, written, k, *, segment_ids, cache):
        """``(h [B, T, D, N], recurrent cache entries)``: ``h_t = keep_t * h_{t-1} + written_t k_t^T``."""
        del segment_ids  # already folded into keep
        state = self._scan(keep, written[..., None] * k[:, :, None, :], None if cache is None else cache["state"])
        return state, ({} if cache is None else {"state": state[:, -1]})

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        del max_len  # a recurrent state does not grow with the sequence
        return {"conv": self.conv.init_cache(batch_size, self.channels, dtype),
                "state": jnp.zeros((batch_size, self.channels, self.state_dim), jnp.float32)}


class MuonSSMLongHorn(LongHorn):
    """LongHorn with the MuonSSM velocity over Newton-Schulz-conditioned injections (module docstring)."""

    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        settings = config.muonssm
        self.gamma, self.tau, self.ns_steps = settings.gamma, settings.tau, settings.ns_steps
        self.ns_coefficients, self.ns_eps = settings.ns_coefficients, settings.ns_eps
        self.groups = 1 if settings.ns_scope == "all" else config.num_heads  # num_heads divides expand * d_model

    def injection_scale(self, written, k):
        """``tau r_k`` per token and channel (``[B, T, D]``): ``tau NS_k(U_t) = scale * U_t`` per group."""
        grouped = written.reshape(*written.shape[:2], self.groups, -1)
        sum_squares = jnp.sum(grouped * grouped, axis=-1) * jnp.sum(k * k, axis=-1, keepdims=True)
        scale = self.tau * rank_one_scale(sum_squares, steps=self.ns_steps, coefficients=self.ns_coefficients,
                                          eps=self.ns_eps)
        return jnp.repeat(scale, self.channels // self.groups, axis=-1)

    def recurrence(self, keep, written, k, *, segment_ids, cache):
        written = self.injection_scale(written, k) * written
        if self.gamma == 0:
            return LongHorn.recurrence(self, keep, written, k, segment_ids=segment_ids, cache=cache)
        injection = written[..., None] * k[:, :, None, :]
        momentum = jnp.full(injection.shape, self.gamma, jnp.float32)
        if segment_ids is not None:
            momentum = jnp.where(document_starts(segment_ids)[..., None, None], 0.0, momentum)
        velocity = self._scan(momentum, injection, None if cache is None else cache["velocity"])
        state = self._scan(keep, velocity, None if cache is None else cache["state"])
        return state, ({} if cache is None else {"state": state[:, -1], "velocity": velocity[:, -1]})

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        cache = super().init_cache(batch_size, max_len, dtype)
        return cache if self.gamma == 0 else {**cache, "velocity": jnp.zeros_like(cache["state"])}


def longhorn_flops(config: ModelConfigBase, seq_len: int, *, momentum: bool = False) -> float:
    """Forward FLOPs per token (module docstring)."""
    del seq_len  # a diagonal scan costs the same at every position
    channels, state_dim, rank = longhorn_shape(config)
    width = config.d_model
    projections = 2 * width * 2 * channels + 2 * channels * (2 * state_dim + rank) + 2 * rank * channels
    projections += 2 * channels * width
    scan = (9 if momentum else 6) * channels * state_dim
    return projections + 2 * config.longhorn.conv_kernel * channels + scan


register("longhorn", lambda config, rngs: LongHorn(config, rngs=rngs), longhorn_flops, sections=("longhorn",),
         context_parallel=True)
register("muonssm_longhorn", lambda config, rngs: MuonSSMLongHorn(config, rngs=rngs),
         lambda config, seq_len: longhorn_flops(config, seq_len, momentum=config.muonssm.gamma != 0),
         sections=("longhorn", "muonssm"), context_parallel=True)
