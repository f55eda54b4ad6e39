"""Softmax attention mixers: ``attention`` (causal, full context) and ``swa`` (sliding window + sinks).

With ``model.attention.causal = false`` a query sees every key of its segment (bidirectional; the
looped model's block sets it from ``model.looped.attention``); such a mixer has no decoding cache.

Per head h, with RoPE applied to queries and keys at per-document positions:

    q_t = R(t) W_q x_t,  k_s = R(s) W_k x_s,  v_s = W_v x_s
    y_t = W_o concat_h( sum_{s visible from t} softmax_s(q_t . k_s / sqrt(D)) v_s )

With ``model.attention.conv_kernel = K > 0`` the projections first pass a short causal depthwise
convolution (``ShortConv``, per document): ``q_t = R(t) Conv_K(W_q x)_t`` and likewise k, v, so a
key can carry the tokens just before it (what a previous-token head otherwise has to learn; the
recurrent mixers have the same convolution); decoding keeps the last ``K - 1`` projections.

Keys/values may have fewer heads than queries (grouped-query attention, ``num_kv_heads``); which
keys are visible is the rule of ``seqmodels.layers.attention``. Transformer++ is this mixer in every
layer, each followed by a SwiGLU MLP, pre-RMSNorm. With the sequence split over ``mesh.context``
every shard's queries attend to the gathered keys, or to key blocks passed round a ring
(``model.attention.context_impl``; causal blocks load-balanced by ``context_layout``), a sliding window to a
halo (``seqmodels.layers.context_attention``).

FLOPs per token (forward): projections ``2 D (2 H Dh + 2 Hkv Dh)`` (plus ``2 K (H + 2 Hkv) Dh`` for
the convolution) plus scores and values
``4 H Dh * mean_visible_keys``, where ``mean_visible_keys`` is ``(T + 1) / 2`` for causal attention
over a row of T tokens (``T`` when bidirectional), and the mean of ``min(t + 1, window + sinks)`` for a sliding
window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from seqmodels.config_base import ConfigError, _require, _require_at_least, _require_choices, describe
from seqmodels.config_model import ModelConfigBase
from seqmodels.layers.attention import (attend, attend_rows, cache_capacity, init_kv_cache, update_kv_cache,
                                        visibility_mask)
from seqmodels.layers.attention_projections import AttentionProjections
from seqmodels.layers.context import sequence_is_split
from seqmodels.layers.context_attention import split_attention
from seqmodels.layers.conv import ShortConv
from seqmodels.mixers.registry import register, register_section
from seqmodels.sharding import constrain


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
    context_impl: Literal["gather", "ring"] = describe(
        "causal full attention over rows split by mesh.context: gather (each shard all-gathers the row's keys and "
        "values: [T / C, T] scores per shard) or ring (key/value blocks pass shard to shard in C - 1 ppermute "
        "rounds under an online softmax: [T / C, T / C] scores per round); a sliding window takes a halo under "
        "either (when window - 1 <= T / C)", "gather")
    context_layout: Literal["balanced", "contiguous"] = describe(
        "order of the ring's causal blocks under mesh.context (context_impl=ring, causal full attention): balanced "
        "(inside the attention call the row's 2C half-shards are re-laid so shard c holds halves c and 2C - 1 - c: "
        "every shard folds 2C + 1 half-by-half blocks, against 4 (c + 1) for shard c contiguous; needs T / C even) "
        "or contiguous (no re-layout); the gather and bidirectional attention ignore it", "balanced")
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

    def check_model(self, model: ModelConfigBase) -> None:
        """Key/value heads divide the query heads; the head width is even (RoPE rotates pairs); only the looped
        model's blocks may be bidirectional."""
        _require(self.head_dim or model.head_dim % 2 == 0, "model.d_model",
                 f"model.d_model / model.num_heads = {model.d_model} / {model.num_heads} = {model.head_dim} is the "
                 "attention head width, which must be even (RoPE rotates pairs); change model.d_model or "
                 "model.num_heads, or set an even model.attention.head_dim")
        kv_heads = self.num_kv_heads or model.num_heads
        _require(model.num_heads % kv_heads == 0, "model.attention.num_kv_heads",
                 f"{kv_heads} does not divide model.num_heads={model.num_heads}")
        _require(model.kind == "looped" or self.causal, "model.attention.causal",
                 "false (bidirectional) is for the looped model's blocks (model.looped.attention); a decoder LM "
                 "must be causal")


register_section("attention", AttentionConfig, "attention settings")


@dataclass(frozen=True)
class SlidingWindowConfig:
    """The ``swa`` mixer: causal attention over the last ``window`` tokens plus ``num_sinks`` sink tokens."""

    window: int = describe("tokens each query sees, itself included", 256)
    num_sinks: int = describe("first tokens of each document every query also sees (attention sinks)", 0)

    def __post_init__(self):
        _require_at_least(self, "model.swa", window=1, num_sinks=0)


register_section("swa", SlidingWindowConfig, "sliding-window attention settings")


class Attention(AttentionProjections):
    """Causal multi-head attention; ``window=None`` for full context, else sliding window + sinks."""

    def __init__(self, config: ModelConfigBase, *, window: int | None, num_sinks: int, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.window, self.num_sinks, self.causal = window, num_sinks, config.attention.causal
        self.context_impl, self.context_layout = config.attention.context_impl, config.attention.context_layout
        if window is not None and not self.causal:
            raise ConfigError("model.attention.causal = false is bidirectional full attention; the sliding-window "
                              "mixer (swa) is causal only")
        kernel = config.attention.conv_kernel
        heads, kv_heads = config.num_heads, self.kv_heads
        self.convs = nnx.List([ShortConv(width * self.head_dim, kernel, rngs=rngs, axis_name="heads")
                               for width in (heads, kv_heads, kv_heads)]) if kernel else None

    def _convolve(self, projections, segment_ids, cache):
        """``(q, k, v)`` through the short convolutions (when configured), and their new decoding cache."""
        if self.convs is None:
            return projections, {}
        outputs, new_cache = [], {}
        for name, conv, x in zip("qkv", self.convs, projections):
            flat = x.reshape(*x.shape[:2], -1)
            flat, new_cache[f"conv_{name}"] = conv(flat, segment_ids=segment_ids,
                                                  cache=None if cache is None else cache[f"conv_{name}"])
            outputs.append(flat.reshape(x.shape))
        return outputs, new_cache

    def _project(self, x, positions, segment_ids=None, cache=None):
        """RoPE'd ``q [B, T, H, Dh]``, ``k, v [B, T, Hkv, Dh]`` and the convolutions' decoding cache."""
        (q, k, v), conv_cache = self._convolve((self.query(x), self.key(x), self.value(x)), segment_ids, cache)
        return (*self.rotate(q, k, v, positions), conv_cache)

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        batch, length = x.shape[:2]
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        q, k, v, conv_cache = self._project(x, positions, segment_ids, cache)
        rule = dict(window=self.window, num_sinks=self.num_sinks)
        if cache is not None and not self.causal:
            raise ValueError("bidirectional attention (model.attention.causal = false) cannot decode from a cache")
        if cache is not None:
            ones = jnp.ones((batch, length), jnp.int32)
            keys = jnp.concatenate([cache["k"], k.astype(cache["k"].dtype)], axis=1)
            values = jnp.concatenate([cache["v"], v.astype(cache["v"].dtype)], axis=1)
            k_positions = jnp.concatenate([cache["positions"], positions], axis=1)
            k_segments = jnp.concatenate([(cache["positions"] >= 0).astype(jnp.int32), ones], axis=1)
            mask = visibility_mask(ones, positions, k_segments, k_positions, **rule)
            out = attend(q, keys.astype(q.dtype), values.astype(q.dtype), mask, implementation=self.implementation)
            cache = {**update_kv_cache(cache, k, v, positions, **rule), **conv_cache}
        elif sequence_is_split(length):
            out = split_attention(q, k, v, segment_ids, positions, causal=self.causal,
                                  implementation=self.implementation, context_impl=self.context_impl,
                                  context_layout=self.context_layout, **rule)
        else:
            out = attend_rows(q, k, v, segment_ids, positions, causal=self.causal,
                              implementation=self.implementation, **rule)
        out = checkpoint_name(constrain(out, ("batch", "seq", "heads", "head_dim")), "attention_out")
        return self.out(out), cache

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        capacity = cache_capacity(max_len, self.window, self.num_sinks)
        cache = init_kv_cache(batch_size, capacity, self.kv_heads, self.head_dim, dtype)
        for name, conv in zip("qkv", self.convs or ()):
            cache[f"conv_{name}"] = jnp.zeros((batch_size, conv.kernel_size - 1, conv.bias.get_value().shape[0]), dtype)
        return cache


def mean_visible_keys(seq_len: int, window: int | None, num_sinks: int = 0, *, causal: bool = True) -> float:
    """Mean over positions t < seq_len of the keys a query sees (every key of the row when not causal:
    full attention only)."""
    if not causal:
        return float(seq_len)
    if window is None:
        return (seq_len + 1) / 2
    limit = window + num_sinks
    full = min(seq_len, limit)
    return (full * (full + 1) / 2 + (seq_len - full) * limit) / seq_len


def _flops(config: ModelConfigBase, seq_len: int, window: int | None, num_sinks: int) -> float:
    heads, head_dim = config.num_heads, config.attention_head_dim
    kv_heads = config.attention.num_kv_heads or heads
    projections = 2 * config.d_model * (2 * heads * head_dim + 2 * kv_heads * head_dim)
    projections += 2 * config.attention.conv_kernel * (heads + 2 * kv_heads) * head_dim
    visible = mean_visible_keys(seq_len, window, num_sinks, causal=config.attention.causal)
    return projections + 4 * heads * head_dim * visible


register("attention",
         lambda config, rngs: Attention(config, window=None, num_sinks=0, rngs=rngs),
         lambda config, seq_len: _flops(config, seq_len, None, 0), sections=("attention",), context_parallel=True)
register("swa",
         lambda config, rngs: Attention(config, window=config.swa.window, num_sinks=config.swa.num_sinks,
                                        rngs=rngs),
         lambda config, seq_len: _flops(config, seq_len, config.swa.window, config.swa.num_sinks),
         sections=("attention", "swa"), context_parallel=True)
