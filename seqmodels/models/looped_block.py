"""The transformer block of the looped model: pre-norm attention (causal or bidirectional) + SwiGLU.

    h = x + W_o Attn(RoPE(W_q n(x)), RoPE(W_k n(x)), W_v n(x); mask)     n = RMSNorm
    y = h + SwiGLU(n(h))

``mask`` is a boolean ``[B, 1, T, T]``: which keys each query sees (built once per forward by
``attention_mask``, shared by every loop). RoPE positions are the indices of the padded sequence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from seqmodels.config import ModelConfig
from seqmodels.layers.attention import attend
from seqmodels.layers.attention_projections import AttentionProjections
from seqmodels.layers.mlp import SwiGLU
from seqmodels.layers.norms import RMSNorm
from seqmodels.sharding import constrain


def attention_mask(valid: jax.Array, *, causal: bool) -> jax.Array:
    """``[B, 1, T, T]``: query t sees key s iff s is a token (``valid: [B, T]``) and, if causal, s <= t."""
    visible = jnp.broadcast_to(valid[:, None, :], (*valid.shape, valid.shape[1]))
    if causal:
        length = valid.shape[1]
        visible = visible & (jnp.arange(length)[None, :, None] >= jnp.arange(length)[None, None, :])
    return visible[:, None]


class LoopedAttention(AttentionProjections):
    """Multi-head (grouped-query) attention under an explicit mask, RoPE on queries and keys."""

    def __call__(self, x: jax.Array, mask: jax.Array, positions: jax.Array) -> jax.Array:
        q, k, v = self.rotate(self.query(x), self.key(x), self.value(x), positions)
        out = attend(q, k, v, mask, implementation=self.implementation)
        return self.out(constrain(out, ("batch", "seq", "heads", "head_dim")))


class LoopBlock(nnx.Module):
    """Pre-norm residual block: attention, then a SwiGLU MLP (when ``model.mlp``)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.attention_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.attention = LoopedAttention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps) if config.mlp else None
        self.mlp = SwiGLU(config.d_model, config.mlp_hidden, rngs=rngs, std=config.init_std) if config.mlp else None

    def __call__(self, x: jax.Array, mask: jax.Array, positions: jax.Array) -> jax.Array:
        mixed = self.attention(self.attention_norm(x), mask, positions)
        x = x + checkpoint_name(mixed, "mixer_out")
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "seq", "embed"))


def block_flops_per_position(config: ModelConfig, mean_visible_keys: float) -> float:
    """Forward FLOPs of one block at one position: projections ``2 D (2 H Dh + 2 Hkv Dh)``, scores and
    values ``4 H Dh * mean_visible_keys``, SwiGLU ``6 D F``."""
    heads, head_dim = config.num_heads, config.head_dim
    kv_heads = config.attention.num_kv_heads or heads
    projections = 2 * config.d_model * (2 * heads * head_dim + 2 * kv_heads * head_dim)
    mlp = 6 * config.d_model * config.mlp_hidden if config.mlp else 0
    return projections + 4 * heads * head_dim * mean_visible_keys + mlp
