"""The projections every softmax-attention module shares: ``W_q, W_k, W_v, W_o``, optional q/k RMSNorm, RoPE.

    q = R(pos) n_q(W_q x + b_q)    [B, T, H, Dh]       k = R(pos) n_k(W_k x + b_k)    [B, T, Hkv, Dh]
    v = W_v x + b_v                [B, T, Hkv, Dh]     out = W_o concat_h(heads)

The biases ``b_q, b_k, b_v`` exist when ``model.attention.qkv_bias`` is set (Qwen2), and ``Dh`` is
``model.attention.head_dim`` (``d_model / num_heads`` when 0). ``R`` is ``apply_rotary``: the
half-split ("rotate-half") layout of Hugging Face's Llama and Qwen2, so their weights load unpermuted.
``n_q``/``n_k`` are per-head RMSNorms when ``model.attention.qk_norm`` is set. The attribute names
(``query``, ``key``, ``value``, ``out``, ``q_norm``, ``k_norm``) are the parameter paths that
checkpoints, the PyTorch export and the Muon per-head mask rely on (``seqmodels.mixers.attention``,
in the decoder LM and the looped model alike).
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from seqmodels.config_model import ModelConfigBase
from seqmodels.layers.common import Dense, DenseOut
from seqmodels.layers.norms import RMSNorm
from seqmodels.layers.rotary import apply_rotary
from seqmodels.sharding import constrain


class AttentionProjections(nnx.Module):
    """Base of the attention modules: builds the projections and norms; ``rotate`` finishes q, k, v."""

    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        heads, head_dim = config.num_heads, config.attention_head_dim
        kv_heads = config.attention.num_kv_heads or heads
        std = config.init_std
        self.rope_theta = config.attention.rope_theta
        self.implementation = config.attention.implementation
        self.kv_heads, self.head_dim = kv_heads, head_dim
        bias = config.attention.qkv_bias
        self.query = Dense(config.d_model, (heads, head_dim), "embed", ("heads", "head_dim"), rngs=rngs, std=std,
                           use_bias=bias)
        self.key = Dense(config.d_model, (kv_heads, head_dim), "embed", ("kv_heads", "head_dim"), rngs=rngs, std=std,
                         use_bias=bias)
        self.value = Dense(config.d_model, (kv_heads, head_dim), "embed", ("kv_heads", "head_dim"), rngs=rngs,
                           std=std, use_bias=bias)
        self.out = DenseOut((heads, head_dim), config.d_model, ("heads", "head_dim"), "embed", rngs=rngs, std=std)
        norm = config.attention.qk_norm
        self.q_norm = RMSNorm(head_dim, eps=config.norm_eps, axis_name="head_dim") if norm else None
        self.k_norm = RMSNorm(head_dim, eps=config.norm_eps, axis_name="head_dim") if norm else None

    def rotate(self, q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array):
        """Projected ``q, k, v`` -> (q/k-normed) RoPE'd, sharding-constrained and named for remat policies."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = constrain(apply_rotary(q, positions, self.rope_theta), ("batch", "seq", "heads", "head_dim"))
        k = constrain(apply_rotary(k, positions, self.rope_theta), ("batch", "seq", "kv_heads", "head_dim"))
        v = constrain(v, ("batch", "seq", "kv_heads", "head_dim"))
        return checkpoint_name(q, "query"), checkpoint_name(k, "key"), checkpoint_name(v, "value")
