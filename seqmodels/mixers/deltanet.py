"""DeltaNet and Gated DeltaNet mixers (``deltanet``, ``gated_deltanet``).

DeltaNet: Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence Length"
(NeurIPS 2024); Gated DeltaNet: Yang, Kautz & Hatamizadeh, "Gated Delta Networks" (ICLR 2025).
Per token t, with H heads, key width K and value width V per head::

    q_t, k_t, v_t = SiLU(ShortConv(W_q x))_t, SiLU(ShortConv(W_k x))_t, SiLU(ShortConv(W_v x))_t
    q_t, k_t      <- q_t / ||q_t||, k_t / ||k_t||                   (L2 per head)
    beta_t        = sigmoid(W_beta x_t)                              [H]
    log_decay_t   = -exp(A_log) * softplus(W_a x_t + dt_bias)        [H]  (gated only; 0 for DeltaNet)
    S_t           = exp(log_decay_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      [K, V]
    o_t           = K^{-1/2} S_t^T q_t
    out_t         = W_out (RMSNorm(o_t) * SiLU(W_g x_t))             (RMSNorm per head, over V)

The recurrence is ``pallas_kernels.gated_delta_rule`` (``log_decay=None`` for DeltaNet;
``impl = model.kernel_impl``): its chunked WY / UT form for training, one recurrent step per token
when decoding from the cache (``impl="reference"``; a multi-token prefill runs the chunked form
from the cached state). The cache holds the convolutions' last ``conv_kernel - 1`` inputs and the
state ``[B, H, K, V]`` float32. In packed rows the convolutions stop at document boundaries and
the state is cut at each document's first token (a log decay of -30 there, also for DeltaNet).
With the sequence split over ``mesh.context`` the convolutions take a halo and the delta rule passes
its state between shards (``seqmodels.layers.state_passing.split_gated_delta_rule``).

Subclasses replace the recurrence by overriding ``recurrence`` (MuonSSM: ``muonssm.py``).

FLOPs per token (forward; ``C`` = min(chunk_size, T), ``D`` = d_model, conv width ``W``):
projections ``2 D (2 H K + 2 H V + H [+ H gated]) + 2 H V D``, convolutions ``2 W H (2 K + V)``,
and the chunked delta rule per head ``C (5 K + 3 V) + 6 K V`` (key products 2CK, the triangular
solve C(K + V), query-key scores 2CK and their product with the corrected values 2CV, and three
[K, V] state products).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels import gated_delta_rule
from seqmodels.config_base import _require, _require_at_least, describe, is_chunk_size
from seqmodels.config_model import ModelConfigBase
from seqmodels.layers.common import Dense, DenseOut, constant_param
from seqmodels.layers.context import sequence_is_split
from seqmodels.layers.conv import ShortConv
from seqmodels.layers.decay import a_log_init, dt_bias_init, step_and_log_decay
from seqmodels.layers.norms import RMSNorm
from seqmodels.layers.segments import reset_at_document_starts
from seqmodels.layers.state_passing import split_gated_delta_rule
from seqmodels.mixers.registry import register, register_section
from seqmodels.sharding import constrain, kernel_spec


@dataclass(frozen=True)
class DeltaNetConfig:
    """The ``deltanet`` and ``gated_deltanet`` mixers (and the backbone of ``muonssm_gated_deltanet``)."""

    head_dim: int = describe("K: query/key width per head; 0 = d_model / model.num_heads", 0)
    value_head_dim: int = describe("V: value width per head; 0 = the key width K", 0)
    conv_kernel: int = describe("width of the short causal depthwise convolution over q, k, v", 4)
    chunk_size: int = describe("tokens per chunk of the chunked training form (power of two >= 16)", 64)

    def __post_init__(self):
        _require_at_least(self, "model.deltanet", head_dim=0, value_head_dim=0, conv_kernel=1)
        _require(is_chunk_size(self.chunk_size), "model.deltanet.chunk_size",
                 f"must be a power of two >= 16, got {self.chunk_size}")


register_section("deltanet", DeltaNetConfig, "DeltaNet / Gated DeltaNet settings")


L2_EPS = 1e-6
DT_RANGE = (1e-3, 1e-1)  # initial softplus(W_a u + dt_bias), log-uniform (seqmodels.layers.decay)


def deltanet_shape(config: ModelConfigBase) -> tuple[int, int, int]:
    """``(heads H, key width K, value width V)`` per head of the DeltaNet mixers under ``config``."""
    key_dim = config.deltanet.head_dim or config.d_model // config.num_heads
    return config.num_heads, key_dim, config.deltanet.value_head_dim or key_dim


def l2_normalize(x: jax.Array) -> jax.Array:
    """``x / sqrt(||x||^2 + eps)`` over the last axis, in float32, returned in ``x.dtype``."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + L2_EPS)).astype(x.dtype)


class DeltaNet(nnx.Module):
    """DeltaNet (``gated=False``) or Gated DeltaNet (``gated=True``)."""

    def __init__(self, config: ModelConfigBase, *, gated: bool, rngs: nnx.Rngs):
        settings, std, width = config.deltanet, config.init_std, config.d_model
        heads, key_dim, value_dim = deltanet_shape(config)
        self.heads, self.key_dim, self.value_dim, self.gated = heads, key_dim, value_dim, gated
        self.chunk_size, self.impl = settings.chunk_size, config.kernel_impl
        head_axes = ("heads", "head_dim")
        self.query = Dense(width, (heads, key_dim), "embed", head_axes, rngs=rngs, std=std)
        self.key = Dense(width, (heads, key_dim), "embed", head_axes, rngs=rngs, std=std)
        self.value = Dense(width, (heads, value_dim), "embed", head_axes, rngs=rngs, std=std)
        self.beta_proj = Dense(width, heads, "embed", "heads", rngs=rngs, std=std)
        self.gate = Dense(width, (heads, value_dim), "embed", head_axes, rngs=rngs, std=std)
        self.q_conv = ShortConv(heads * key_dim, settings.conv_kernel, rngs=rngs, axis_name="heads")
        self.k_conv = ShortConv(heads * key_dim, settings.conv_kernel, rngs=rngs, axis_name="heads")
        self.v_conv = ShortConv(heads * value_dim, settings.conv_kernel, rngs=rngs, axis_name="heads")
        if gated:
            self.decay_proj = Dense(width, heads, "embed", "heads", rngs=rngs, std=std)
            self.a_log = constant_param(a_log_init(rngs.params(), heads), ("heads",))
            self.dt_bias = constant_param(dt_bias_init(rngs.params(), heads, *DT_RANGE), ("heads",))
        self.norm = RMSNorm(value_dim, eps=config.norm_eps, axis_name="head_dim")
        self.out = DenseOut((heads, value_dim), width, head_axes, "embed", rngs=rngs, std=std)

    def _project(self, x, segment_ids, cache):
        """Convolved, activated ``q, k [B, T, H, K]`` (L2-normalised), ``v [B, T, H, V]`` and the conv cache."""
        batch, length = x.shape[:2]
        conv_cache, new_cache, outputs = cache or {}, {}, []
        for name, proj, conv, dim in (("q", self.query, self.q_conv, self.key_dim),
                                      ("k", self.key, self.k_conv, self.key_dim),
                                      ("v", self.value, self.v_conv, self.value_dim)):
            flat = proj(x).reshape(batch, length, self.heads * dim)
            flat, new_cache[f"conv_{name}"] = conv(flat, segment_ids=segment_ids, cache=conv_cache.get(f"conv_{name}"))
            outputs.append(constrain(jax.nn.silu(flat).reshape(batch, length, self.heads, dim),
                                     ("batch", "seq", "heads", "head_dim")))
        q, k, v = outputs
        return l2_normalize(q), l2_normalize(k), v, (None if cache is None else new_cache)

    def log_decay(self, x, segment_ids):
        """``[B, T, H]`` float32 log decays (zeros for DeltaNet, -30 at document starts), or None."""
        if self.gated:
            _, log_decay = step_and_log_decay(self.decay_proj(x), self.dt_bias.get_value(), self.a_log.get_value())
        elif segment_ids is None:
            return None
        else:
            log_decay = jnp.zeros(segment_ids.shape + (self.heads,), jnp.float32)
        return reset_at_document_starts(log_decay, segment_ids)

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        """``x: [B, T, d_model]`` -> ``(y [B, T, d_model], cache)``; positions are not used (a recurrence)."""
        del positions
        q, k, v, conv_cache = self._project(x, segment_ids, cache)
        beta = jax.nn.sigmoid(self.beta_proj(x).astype(jnp.float32))
        o, state = self.recurrence(q, k, v, beta, self.log_decay(x, segment_ids), segment_ids=segment_ids,
                                   cache=cache)
        o = self.norm(o, gate=self.gate(x))
        return self.out(o), (None if cache is None else {**conv_cache, **state})

    def recurrence(self, q, k, v, beta, log_decay, *, segment_ids, cache):
        """``(o [B, T, H, V], recurrent cache entries or None)``: the (gated) delta rule."""
        del segment_ids  # already folded into log_decay
        if cache is None and sequence_is_split(q.shape[1]):
            return split_gated_delta_rule(q, k, v, beta, log_decay, scale=None, chunk_size=self.chunk_size,
                                          impl=self.impl), None
        impl = "reference" if cache is not None and q.shape[1] == 1 else self.impl
        o, state = gated_delta_rule(q, k, v, beta, log_decay, chunk_size=self.chunk_size, impl=impl,
                                    initial_state=None if cache is None else cache["state"],
                                    output_final_state=cache is not None,
                                    partition_spec=kernel_spec(("batch", "seq", "heads"), q.shape[:3]))
        return o, (None if cache is None else {"state": state})

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        del max_len  # a recurrent state does not grow with the sequence
        keys = self.heads * self.key_dim
        return {"conv_q": self.q_conv.init_cache(batch_size, keys, dtype),
                "conv_k": self.k_conv.init_cache(batch_size, keys, dtype),
                "conv_v": self.v_conv.init_cache(batch_size, self.heads * self.value_dim, dtype),
                "state": jnp.zeros((batch_size, self.heads, self.key_dim, self.value_dim), jnp.float32)}


def deltanet_flops(config: ModelConfigBase, seq_len: int, *, gated: bool, core_per_head=None) -> float:
    """Forward FLOPs per token (module docstring); ``core_per_head(C, K, V)`` replaces the delta-rule term."""
    heads, key_dim, value_dim = deltanet_shape(config)
    width, conv, chunk = config.d_model, config.deltanet.conv_kernel, min(config.deltanet.chunk_size, seq_len)
    gates = heads * (2 if gated else 1)
    projections = 2 * width * (2 * heads * key_dim + 2 * heads * value_dim + gates) + 2 * heads * value_dim * width
    convolutions = 2 * conv * heads * (2 * key_dim + value_dim)
    core = (core_per_head or _delta_rule_flops)(chunk, key_dim, value_dim)
    return projections + convolutions + heads * core


def _delta_rule_flops(chunk: int, key_dim: int, value_dim: int) -> float:
    return chunk * (5 * key_dim + 3 * value_dim) + 6 * key_dim * value_dim


register("deltanet", lambda config, rngs: DeltaNet(config, gated=False, rngs=rngs),
         lambda config, seq_len: deltanet_flops(config, seq_len, gated=False), sections=("deltanet",),
         context_parallel=True)
register("gated_deltanet", lambda config, rngs: DeltaNet(config, gated=True, rngs=rngs),
         lambda config, seq_len: deltanet_flops(config, seq_len, gated=True), sections=("deltanet",),
         context_parallel=True)
