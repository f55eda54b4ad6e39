"""The per-layer compressor of AHN (``model.ahn.compressor``): a recurrence over the tokens leaving the window.

One layer of the frozen base has post-RoPE queries ``q_t [H, Dh]`` and keys / values ``k_s, v_s [Hkv, Dh]``
(expanded over the GQA groups to ``H`` heads, query head ``h`` reading key head ``h // (H / Hkv)``) and
the normalised hidden state ``x_s`` that fed its projections. Attention keeps the ``sinks`` first tokens
and the last ``ring = window - sinks``; token ``s`` leaves at step ``t = s + ring`` (when ``s >= sinks``),
so the state read at position ``t`` holds exactly the tokens ``sinks <= s <= t - ring``: those ``t``
no longer attends to. With ``k, q`` L2-normalised per head, per head::

    gated_deltanet  beta_s = sigmoid(W_beta x_s), log a_s = -exp(A_log) softplus(W_a x_s + dt_bias)
                    S <- a_s (I - beta_s k_s k_s^T) S + beta_s k_s v_s^T
    deltanet        the same with a_s = 1
    mamba2          Delta_s = softplus(W_a x_s + dt_bias), log a_s = -exp(A_log) Delta_s
                    S <- a_s S + Delta_s k_s v_s^T
    read-out        o_t = Dh^{-1/2} S^T q_t;   m_t = W_m,h (RMSNorm(o_t) * SiLU(W_g x_t))   per head
                    (W_m,h: [Dh, Dh] per head, initialised to zero, so m = 0 at step 0)

``m_t`` is added to the attention output of head ``h`` before the layer's ``o_proj``. Training runs
the recurrence with the chunked kernels (``gated_delta_rule``; ``chunk_gla`` for mamba2) over the
*evicted stream*: position ``t`` of the stream carries token ``t - ring`` when ``t - ring >= sinks``,
and a no-op write (zero key, zero strength, zero log decay) otherwise, so the kernels' output at ``t``
(which includes stream token ``t``) is the read-out above. Decoding applies the same rule one evicted
token at a time (``impl="reference"``).

With the row split over ``mesh.context`` (C shards of ``T / C`` tokens) the evicted stream is the row's
keys, values and write gates delayed by ``ring`` tokens (``seqmodels.layers.context.delayed``): shard c
takes the previous shard's last ``ring`` raw keys / values ``[B, ring, Hkv, Dh]`` and gates ``[B, ring, H]``
as a halo (one ``ppermute``; a traced ``ring`` from ``random_window``, or one longer than a shard, gathers
the row instead), and the recurrence passes its state between shards by the float32 prefix scan of
``seqmodels.layers.state_passing`` (``split_gated_delta_rule``: ceil(log2 C) rounds of a ``[B, H, Dh, Dh]``
state and a ``[Dh, Dh]`` transition per head, two kernel passes per shard; ``split_chunk_gla`` for mamba2:
a per-head decay as the transition, one pass and a closed-form correction).

Departures from the paper's code (ByteDance-Seed/AHN): the write gates and the read-out gate use the
layer's input-normalised hidden state of the evicted / current token as there, but the output map is a
per-head ``[Dh, Dh]`` matrix (the issue's layout, no cross-head mixing) and no optional query
projection (``use_q_proj``) or router between attention and memory exists; the sum goes to ``o_proj``
unnormalised, as in the paper's default path.

Parameters (``blocks/i/ahn``): ``gate`` ``[D, H, Dh]``, ``norm/scale`` ``[Dh]``, ``readout`` ``[H, Dh, Dh]``,
and per rule ``beta_proj`` ``[D, H]`` (delta rules) and ``decay_proj`` ``[D, H]``, ``a_log``, ``dt_bias``
``[H]`` (gated_deltanet, mamba2).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels import chunk_gla, gated_delta_rule
from seqmodels.config import ModelConfig
from seqmodels.layers.common import Dense, constant_param
from seqmodels.layers.context import delayed, sequence_is_split
from seqmodels.layers.decay import a_log_init, dt_bias_init, step_and_log_decay
from seqmodels.layers.norms import RMSNorm
from seqmodels.layers.state_passing import split_chunk_gla, split_gated_delta_rule
from seqmodels.mixers.deltanet import DT_RANGE, l2_normalize


@dataclass(frozen=True)
class CompressorRule:
    """How one compressor writes: whether it has a delta-rule strength ``beta`` and a learned decay."""

    delta_rule: bool  # gated_delta_rule (beta, error-correcting write) or chunk_gla (additive write)
    decays: bool


KEYS = ("batch", "seq", "kv_heads", None)  # logical axes of the raw keys / values, [B, T, Hkv, Dh]
GATES = ("batch", "seq", "heads")  # of the write gates, [B, T, H]
COMPRESSORS = {"gated_deltanet": CompressorRule(delta_rule=True, decays=True),
               "deltanet": CompressorRule(delta_rule=True, decays=False),
               "mamba2": CompressorRule(delta_rule=False, decays=True)}


def expand_kv_heads(x: jax.Array, heads: int) -> jax.Array:
    """``[B, T, Hkv, Dh] -> [B, T, H, Dh]``: each key / value head repeated over its group of query heads."""
    groups = heads // x.shape[2]
    return x if groups == 1 else jnp.repeat(x, groups, axis=2)


def evicted_stream(x: jax.Array, ring, sinks, names: tuple) -> jax.Array:
    """``x [B, T, ...]`` shifted so position t holds token ``t - ring`` where ``t - ring >= sinks``, else 0.

    ``ring`` and ``sinks`` may be traced integers (a window drawn per step); ``names`` are the logical axes
    of ``x``, used when the row is split over ``context`` (the shift then crosses shards: module docstring)."""
    length = x.shape[1]
    source = jnp.arange(length) - ring
    valid = source >= sinks
    if sequence_is_split(length):
        shifted = delayed(x, ring, names)
    else:
        shifted = jnp.take(x, jnp.clip(source, 0, length - 1), axis=1)
    return jnp.where(valid.reshape((1, length) + (1,) * (x.ndim - 2)), shifted, jnp.zeros_like(shifted))


class Compressor(nnx.Module):
    """The AHN compressor of one layer (module docstring)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        settings = config.ahn
        self.rule = COMPRESSORS[settings.compressor]
        self.heads, self.head_dim = config.num_heads, config.attention_head_dim
        self.chunk_size, self.impl = settings.chunk_size, config.kernel_impl
        width, heads, std = config.d_model, self.heads, config.init_std
        self.beta_proj = Dense(width, heads, "embed", "heads", rngs=rngs, std=std) if self.rule.delta_rule else None
        if self.rule.decays:
            self.decay_proj = Dense(width, heads, "embed", "heads", rngs=rngs, std=std)
            self.a_log = constant_param(a_log_init(rngs.params(), heads), ("heads",))
            self.dt_bias = constant_param(dt_bias_init(rngs.params(), heads, *DT_RANGE), ("heads",))
        else:
            self.decay_proj = self.a_log = self.dt_bias = None
        self.gate = Dense(width, (heads, self.head_dim), "embed", ("heads", "head_dim"), rngs=rngs, std=std)
        self.norm = RMSNorm(self.head_dim, eps=config.norm_eps, axis_name="head_dim")
        self.readout = constant_param(jnp.zeros((heads, self.head_dim, self.head_dim)), ("heads", "head_dim", None))

    def write_gates(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(strength, log_decay)``, float32 ``[B, T, H]``, of tokens with normalised hidden states ``x``.

        ``strength`` is ``beta`` for the delta rules and ``Delta`` for mamba2; ``log_decay`` is 0 for deltanet."""
        shape = x.shape[:2] + (self.heads,)
        log_decay = jnp.zeros(shape, jnp.float32)
        if self.rule.decays:
            step, log_decay = step_and_log_decay(self.decay_proj(x), self.dt_bias.get_value(), self.a_log.get_value())
        if self.rule.delta_rule:
            return jax.nn.sigmoid(self.beta_proj(x).astype(jnp.float32)), log_decay
        return step, log_decay

    def recurrence(self, q, k, v, strength, log_decay, *, initial_state=None, impl=None):
        """``(o [B, T, H, Dh], final state [B, H, Dh, Dh] float32)`` of the rule over already-aligned inputs."""
        impl = impl or self.impl
        common = dict(initial_state=initial_state, output_final_state=True, chunk_size=self.chunk_size, impl=impl)
        if self.rule.delta_rule:
            return gated_delta_rule(q, k, v, strength.astype(q.dtype), log_decay if self.rule.decays else None,
                                    **common)
        return chunk_gla(q, k * strength[..., None].astype(k.dtype), v, log_decay, **common)

    def split_recurrence(self, q, k, v, strength, log_decay):
        """``o [B, T, H, Dh]`` of ``recurrence`` from a zero state over a row split by ``context``: the state
        passes between shards (``seqmodels.layers.state_passing``, module docstring)."""
        common = dict(chunk_size=self.chunk_size, impl=self.impl)
        if self.rule.delta_rule:
            return split_gated_delta_rule(q, k, v, strength.astype(q.dtype), log_decay if self.rule.decays else None,
                                          scale=None, **common)
        return split_chunk_gla(q, k * strength[..., None].astype(k.dtype), v, log_decay, scale=k.shape[-1] ** -0.5,
                               **common)

    def read_out(self, o: jax.Array, x: jax.Array) -> jax.Array:
        """``m [B, T, H, Dh]``: the gated, normalised state read of each current token mapped per head."""
        gated = self.norm(o, gate=self.gate(x))
        return jnp.einsum("bthd,hde->bthe", gated, self.readout.get_value().astype(gated.dtype))

    def features(self, q, k, v):
        """L2-normalised ``q`` and expanded, L2-normalised ``k`` and expanded ``v`` (all ``[B, T, H, Dh]``)."""
        return l2_normalize(q), l2_normalize(expand_kv_heads(k, self.heads)), expand_kv_heads(v, self.heads)

    def __call__(self, x, q, k, v, *, ring, sinks, return_state: bool = False):
        """Training / full-sequence form: ``m [B, T, H, Dh]`` for every position (0 before the first eviction);
        with ``return_state`` (one device, a prefill) also the state after the row's evicted tokens, float32
        ``[B, H, Dh, Dh]``: the state ``step`` holds after the same tokens."""
        strength, log_decay = self.write_gates(x)
        k, v = (evicted_stream(a, ring, sinks, KEYS) for a in (k, v))  # raw: the halo moves Hkv heads, not H
        strength, log_decay = (evicted_stream(a, ring, sinks, GATES) for a in (strength, log_decay))
        q, k, v = self.features(q, k, v)
        if sequence_is_split(x.shape[1]):
            if return_state:
                raise ValueError("the compressor's final state is a prefill's, which runs on one device")
            return self.read_out(self.split_recurrence(q, k, v, strength, log_decay), x)
        o, state = self.recurrence(q, k, v, strength, log_decay)
        return (self.read_out(o, x), state.astype(jnp.float32)) if return_state else self.read_out(o, x)

    def step(self, x, q, evicted: dict, state) -> tuple[jax.Array, jax.Array]:
        """Decoding form for one token: write the evicted token (``evicted``: its raw ``k, v [B, 1, Hkv, Dh]``
        and gates ``[B, 1, H]``, zero strength when nothing left the window), then read with ``q``."""
        q, k, v = self.features(q, evicted["k"], evicted["v"])
        o, state = self.recurrence(q, k, v, evicted["strength"], evicted["log_decay"], initial_state=state,
                                   impl="reference")
        return self.read_out(o, x), state

    def init_state(self, batch_size: int) -> jax.Array:
        return jnp.zeros((batch_size, self.heads, self.head_dim, self.head_dim), jnp.float32)


def compressor_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of one layer's compressor: gate projections ``2 D H (1 + decays) `` (delta rules;
    mamba2 ``2 D H``), the output gate ``2 D H Dh``, the read-out map ``2 H Dh^2``, and the chunked core per head
    (delta rule ``C (5 Dh + 3 Dh) + 6 Dh^2``; additive write ``C (2 Dh + 2 Dh) + 4 Dh^2``, ``C = min(chunk, T)``)."""
    rule = COMPRESSORS[config.ahn.compressor]
    width, heads, head_dim = config.d_model, config.num_heads, config.attention_head_dim
    chunk = min(config.ahn.chunk_size, seq_len)
    gates = heads * (int(rule.delta_rule) + int(rule.decays))
    core = chunk * 8 * head_dim + 6 * head_dim ** 2 if rule.delta_rule else chunk * 4 * head_dim + 4 * head_dim ** 2
    return 2 * width * gates + 2 * width * heads * head_dim + 2 * heads * head_dim ** 2 + heads * core
