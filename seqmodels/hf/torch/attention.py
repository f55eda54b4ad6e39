"""Softmax attention (``attention``, ``swa``) in PyTorch: the JAX ``seqmodels.mixers.attention``.

    q_t = R(t) n_q(Conv(W_q x)_t),  k_s = R(s) n_k(Conv(W_k x)_s),  v_s = Conv(W_v x)_s
    y_t = W_o concat_h( sum_{s visible from t} softmax_s(q_t . k_s / sqrt(Dh)) v_s )
    visible(t, s) = s <= t (causal)  and  (t - s < window  or  s < num_sinks)   (sliding window)

The convolution (``model.attention.conv_kernel``) and the q/k norms (``qk_norm``) are optional;
keys and values may have fewer heads (grouped-query attention). Positions are each row's own
(``[B, T]``, -1 at padding): a padded key is visible from no query, and the convolution skips padding.
The decoding cache holds the keys, values and positions still visible to a later query of some row:
every real one for full attention, the sinks and the last ``window`` for a sliding window.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .layers import RMSNorm, ShortConv, apply_rotary, real_tokens


def visible(q_positions: torch.Tensor, k_positions: torch.Tensor, *, window: int | None, num_sinks: int,
            causal: bool) -> torch.Tensor:
    """Boolean ``[B, Tq, Tk]`` of ``q_positions [B, Tq]``, ``k_positions [B, Tk]``: which keys each query sees
    (the rule of the module docstring; never a padded key). A padded query sees every key, so that its
    softmax is defined; its output is discarded."""
    q, k = q_positions[:, :, None], k_positions[:, None, :]
    mask = k <= q if causal else torch.ones_like(q == k)
    if window is not None:
        mask = mask & ((q - k < window) | (k < num_sinks))
    return (mask & real_tokens(k)) | ~real_tokens(q)


class Attention(nn.Module):
    def __init__(self, model: dict, *, window: int | None, num_sinks: int):
        super().__init__()
        settings = model["attention"]
        heads, d_model = model["num_heads"], model["d_model"]
        self.heads, self.kv_heads = heads, settings["num_kv_heads"] or heads
        self.head_dim = settings["head_dim"] or d_model // heads
        self.theta, self.window, self.num_sinks, self.causal = settings["rope_theta"], window, num_sinks, settings["causal"]
        bias = settings["qkv_bias"]
        self.query = nn.Linear(d_model, heads * self.head_dim, bias=bias)
        self.key = nn.Linear(d_model, self.kv_heads * self.head_dim, bias=bias)
        self.value = nn.Linear(d_model, self.kv_heads * self.head_dim, bias=bias)
        self.out = nn.Linear(heads * self.head_dim, d_model, bias=False)
        norm = settings["qk_norm"]
        self.q_norm = RMSNorm(self.head_dim, model["norm_eps"]) if norm else None
        self.k_norm = RMSNorm(self.head_dim, model["norm_eps"]) if norm else None
        kernel = settings["conv_kernel"]
        self.convs = nn.ModuleList([ShortConv(width * self.head_dim, kernel)
                                    for width in (heads, self.kv_heads, self.kv_heads)]) if kernel else None

    def _project(self, x, positions, cache):
        batch, length = x.shape[:2]
        projected = [self.query(x), self.key(x), self.value(x)]
        if self.convs is not None:
            for i, (name, conv) in enumerate(zip("qkv", self.convs)):
                history = None if cache is None else cache.get(f"conv_{name}")
                projected[i], history = conv(projected[i], history, real_tokens(positions))
                if cache is not None:
                    cache[f"conv_{name}"] = history
        q, k, v = (p.reshape(batch, length, -1, self.head_dim) for p in projected)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, positions, self.theta), apply_rotary(k, positions, self.theta), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        """``x [B, T, D]`` at ``positions [B, T]`` -> ``(y [B, T, D], cache)``; ``cache`` is a dict updated in place."""
        q, k, v = self._project(x, positions, cache)
        return self.out(self.attend(q, k, v, positions, cache).reshape(*x.shape[:2], -1)), cache

    def attend(self, q, k, v, positions: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        """The heads before ``out``, ``[B, T, H, Dh]`` in q's dtype, of post-RoPE ``q, k, v`` at ``positions``;
        with ``cache``, over its keys too (then they and ``k, v`` are kept for the next call as still visible)."""
        k_positions = positions
        if cache is not None:
            if not self.causal:
                raise ValueError("bidirectional attention (model.attention.causal = false) cannot decode from a cache")
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=1), torch.cat([cache["v"], v], dim=1)
                k_positions = torch.cat([cache["positions"], positions], dim=1)
            keep = self._still_visible(k_positions)
            cache.update(k=k[:, keep], v=v[:, keep], positions=k_positions[:, keep])
        mask = visible(positions, k_positions, window=self.window, num_sinks=self.num_sinks, causal=self.causal)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        scores = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        heads = torch.einsum("bhts,bshd->bthd", weights, v.float()).to(q.dtype)
        return torch.where(real_tokens(positions)[..., None, None], heads, torch.zeros_like(heads))

    def _still_visible(self, k_positions: torch.Tensor) -> torch.Tensor:
        """``[S]``: the key columns of ``k_positions [B, S]`` that a later query of some row can still see: every
        real key (full), the sinks and the last ``window`` of the row (swa); a column of padding only is dropped."""
        real = real_tokens(k_positions)
        if self.window is not None:
            newest = k_positions.max(dim=1, keepdim=True).values
            real = real & ((k_positions < self.num_sinks) | (k_positions > newest - self.window))
        return real.any(dim=0)


MIXERS = {"attention": lambda model: Attention(model, window=None, num_sinks=0),
          "swa": lambda model: Attention(model, window=model["swa"]["window"], num_sinks=model["swa"]["num_sinks"])}
