"""Mamba2 mixer (SSD: state space duality), after Dao & Gu, "Transformers are SSMs" (ICML 2024).

Per token t of the mixer's input ``u`` (the ``x`` argument, ``[d_model]``), with H heads of P channels
and a state width N (one group: B and C shared by heads)::

    z_t, x_t = W_z u_t, W_x u_t                           [H, P] each (z: output gate; x: ssm_input)
    B_t, C_t = W_B u_t, W_C u_t                           [N] each
    dt_t     = W_dt u_t                                   [H]
    x_t, B_t, C_t <- SiLU(ShortConv(x), ShortConv(B), ShortConv(C))     (causal depthwise, width conv_kernel)
    Delta_t  = softplus(dt_t + dt_bias),  A = -exp(A_log)               [H]
    h_t      = exp(Delta_t A) h_{t-1} + B_t (Delta_t x_t)^T             [H, N, P] (one [N, P] state per head)
    y_t      = h_t^T C_t + D x_t                                        [H, P]
    out_t    = W_out RMSNorm(y_t * SiLU(z_t))                           (over all H P channels, one [H P] scale)

The output norm is the reference Mamba2's (state-spaces/mamba ``Mamba2`` with its defaults:
``RMSNormGated(norm_before_gate=False)`` with ``ngroups = 1``, so one group of all ``H P`` channels).
``model.mamba2.gated_norm: per_head_before_gate`` keeps the earlier rule ``RMSNorm(y_t) * SiLU(z_t)``
per head with a shared ``[P]`` scale (Gated DeltaNet's norm), for checkpoints saved under it; on random
weights the two differ by most of the output's norm, so they are not interchangeable.
Departures from the reference: one group of B and C (``ngroups = 1``, the reference default), the norm's
epsilon is ``model.norm_eps`` (the reference fixes 1e-5), and no learned initial state (its default).

The recurrence is ``pallas_kernels.chunk_gla`` with a scalar decay per head: ``q = C``, ``k = B``,
``v = Delta x``, ``log_decay = Delta A``, ``scale = 1`` (``impl = model.kernel_impl``). Training runs
its chunked form; decoding with a cache runs one recurrent step per token (``impl="reference"``
for one token; a multi-token prefill runs the chunked form from the cached state). The cache holds
the last ``conv_kernel - 1`` inputs of each convolution and the state ``[B, H, N, P]`` float32.
In packed rows the convolutions stop at document boundaries and the state is cut at each
document's first token (``seqmodels.layers.segments``). With the sequence split over ``mesh.context``
the convolutions take a halo and the state passes between shards
(``seqmodels.layers.state_passing.split_chunk_gla``).

Subclasses replace the recurrence by overriding ``recurrence`` (MuonSSM: ``muonssm.py``).

FLOPs per token (forward, 2 per multiply-add; ``C`` = min(chunk_size, T), ``D`` = d_model, ``K`` =
conv_kernel): projections ``2 D (2 H P + 2 N + H) + 2 H P D``, convolutions
``2 K (H P + 2 N)``, and the chunked SSD per head ``2 C (N + P) + 4 N P`` (the [C, C] scores and
their product with v, the chunk-state update and the read-out of the carried state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels import chunk_gla
from seqmodels.config_base import _require, _require_at_least, _require_choices, describe, is_chunk_size
from seqmodels.config_model import ModelConfigBase
from seqmodels.layers.common import Dense, DenseOut, constant_param
from seqmodels.layers.context import sequence_is_split
from seqmodels.layers.conv import ShortConv
from seqmodels.layers.decay import a_log_init, dt_bias_init, step_and_log_decay
from seqmodels.layers.norms import RMSNorm
from seqmodels.layers.segments import reset_at_document_starts
from seqmodels.layers.state_passing import split_chunk_gla
from seqmodels.mixers.registry import register, register_section
from seqmodels.sharding import constrain, kernel_spec


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
        _require(is_chunk_size(self.chunk_size), "model.mamba2.chunk_size",
                 f"must be a power of two >= 16, got {self.chunk_size}")
        _require(0 < self.dt_min <= self.dt_max, "model.mamba2.dt_min",
                 f"need 0 < dt_min <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")

    def check_model(self, model: ModelConfigBase) -> None:
        """The inner width ``expand * d_model`` splits into whole heads of ``head_dim`` channels."""
        inner = self.expand * model.d_model
        _require(not self.head_dim or inner % self.head_dim == 0, "model.mamba2.head_dim",
                 f"{self.head_dim} does not divide model.mamba2.expand * model.d_model = {inner}")


register_section("mamba2", Mamba2Config, "Mamba2 (SSD) settings")


def mamba2_shape(config: ModelConfigBase) -> tuple[int, int, int]:
    """``(heads H, head_dim P, state_dim N)`` of the Mamba2 mixers under ``config``."""
    settings = config.mamba2
    inner = settings.expand * config.d_model
    head_dim = settings.head_dim or inner // config.num_heads
    return inner // head_dim, head_dim, settings.state_dim


class Mamba2(nnx.Module):
    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        settings, std, width = config.mamba2, config.init_std, config.d_model
        heads, head_dim, state_dim = mamba2_shape(config)
        self.heads, self.head_dim, self.state_dim = heads, head_dim, state_dim
        self.chunk_size, self.impl = settings.chunk_size, config.kernel_impl
        head_axes = ("heads", "head_dim")
        self.gate = Dense(width, (heads, head_dim), "embed", head_axes, rngs=rngs, std=std)
        self.x_proj = Dense(width, (heads, head_dim), "embed", head_axes, rngs=rngs, std=std)
        self.b_proj = Dense(width, state_dim, "embed", "state", rngs=rngs, std=std)
        self.c_proj = Dense(width, state_dim, "embed", "state", rngs=rngs, std=std)
        self.dt_proj = Dense(width, heads, "embed", "heads", rngs=rngs, std=std)
        self.x_conv = ShortConv(heads * head_dim, settings.conv_kernel, rngs=rngs, axis_name="heads")
        self.b_conv = ShortConv(state_dim, settings.conv_kernel, rngs=rngs, axis_name="state")
        self.c_conv = ShortConv(state_dim, settings.conv_kernel, rngs=rngs, axis_name="state")
        self.a_log = constant_param(a_log_init(rngs.params(), heads), ("heads",))
        self.dt_bias = constant_param(dt_bias_init(rngs.params(), heads, settings.dt_min, settings.dt_max), ("heads",))
        self.skip = constant_param(jnp.ones((heads,)), ("heads",))
        self.norm_after_gate = settings.gated_norm == "after_gate"
        norm_width, norm_axis = (heads * head_dim, "heads") if self.norm_after_gate else (head_dim, "head_dim")
        self.norm = RMSNorm(norm_width, eps=config.norm_eps, axis_name=norm_axis)
        self.out = DenseOut((heads, head_dim), width, head_axes, "embed", rngs=rngs, std=std)

    def _convolve(self, x, b, c, segment_ids, cache):
        conv_cache = cache or {}
        x, x_cache = self.x_conv(x, segment_ids=segment_ids, cache=conv_cache.get("conv_x"))
        b, b_cache = self.b_conv(b, segment_ids=segment_ids, cache=conv_cache.get("conv_b"))
        c, c_cache = self.c_conv(c, segment_ids=segment_ids, cache=conv_cache.get("conv_c"))
        new_cache = None if cache is None else {"conv_x": x_cache, "conv_b": b_cache, "conv_c": c_cache}
        return jax.nn.silu(x), jax.nn.silu(b), jax.nn.silu(c), new_cache

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        """``x: [B, T, d_model]`` -> ``(y [B, T, d_model], cache)``; positions are not used (a recurrence)."""
        del positions
        batch, length = x.shape[:2]
        heads, head_dim = self.heads, self.head_dim
        ssm_input = self.x_proj(x).reshape(batch, length, heads * head_dim)
        ssm_input, b, c, conv_cache = self._convolve(ssm_input, self.b_proj(x), self.c_proj(x), segment_ids, cache)
        ssm_input = constrain(ssm_input.reshape(batch, length, heads, head_dim), ("batch", "seq", "heads", "head_dim"))
        delta, log_decay = step_and_log_decay(self.dt_proj(x), self.dt_bias.get_value(), self.a_log.get_value())
        log_decay = reset_at_document_starts(log_decay, segment_ids)
        shape = (batch, length, heads, self.state_dim)
        q, k = (jnp.broadcast_to(t[:, :, None], shape) for t in (c, b))
        v = (delta[..., None] * ssm_input.astype(jnp.float32)).astype(ssm_input.dtype)
        y, state = self.recurrence(q, k, v, log_decay, segment_ids=segment_ids, cache=cache)
        y = y + self.skip.get_value().astype(y.dtype)[:, None] * ssm_input
        y = self.gated_norm(y, self.gate(x))
        new_cache = None if cache is None else {**conv_cache, **state}
        return self.out(y), new_cache

    def gated_norm(self, y, gate):
        """``[B, T, H, P]``: ``RMSNorm(y * SiLU(gate))`` over all heads, or ``RMSNorm(y) * SiLU(gate)`` per head."""
        if not self.norm_after_gate:
            return self.norm(y, gate=gate)
        gated = y.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))
        return self.norm(gated.reshape(*y.shape[:2], -1)).reshape(y.shape).astype(y.dtype)

    def recurrence(self, q, k, v, log_decay, *, segment_ids, cache):
        """``(o [B, T, H, P], recurrent cache entries or None)``: the SSD state recurrence."""
        del segment_ids  # already folded into log_decay
        length = q.shape[1]
        if cache is None and sequence_is_split(length):
            return split_chunk_gla(q, k, v, log_decay, scale=1.0, chunk_size=self.chunk_size, impl=self.impl), None
        impl = "reference" if cache is not None and length == 1 else self.impl
        o, state = chunk_gla(q, k, v, log_decay, scale=1.0, chunk_size=self.chunk_size, impl=impl,
                             initial_state=None if cache is None else cache["state"],
                             output_final_state=cache is not None,
                             partition_spec=kernel_spec(("batch", "seq", "heads"), q.shape[:3]))
        return o, (None if cache is None else {"state": state})

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        del max_len  # a recurrent state does not grow with the sequence
        return {"conv_x": self.x_conv.init_cache(batch_size, self.heads * self.head_dim, dtype),
                "conv_b": self.b_conv.init_cache(batch_size, self.state_dim, dtype),
                "conv_c": self.c_conv.init_cache(batch_size, self.state_dim, dtype),
                "state": jnp.zeros((batch_size, self.heads, self.state_dim, self.head_dim), jnp.float32)}


def mamba2_flops(config: ModelConfigBase, seq_len: int, *, core_per_head=None) -> float:
    """Forward FLOPs per token (module docstring); ``core_per_head(C, N, P)`` replaces the SSD term."""
    heads, head_dim, state_dim = mamba2_shape(config)
    width, conv, chunk = config.d_model, config.mamba2.conv_kernel, min(config.mamba2.chunk_size, seq_len)
    projections = 2 * width * (2 * heads * head_dim + 2 * state_dim + heads) + 2 * heads * head_dim * width
    convolutions = 2 * conv * (heads * head_dim + 2 * state_dim)
    core = (core_per_head or _ssd_flops)(chunk, state_dim, head_dim)
    return projections + convolutions + heads * core


def _ssd_flops(chunk: int, state_dim: int, head_dim: int) -> float:
    return 2 * chunk * (state_dim + head_dim) + 4 * state_dim * head_dim


register("mamba2", lambda config, rngs: Mamba2(config, rngs=rngs), mamba2_flops, sections=("mamba2",),
         context_parallel=True)
