"""The Atlas hybrids in PyTorch: the JAX ``seqmodels.mixers.atlas_hybrids``.

    atlas_mag:  y = g * SWA(x) + (1 - g) * Atlas(x),   g = sigmoid(W_gate x + b)
    atlas_mal:  m = Atlas(x);  y = m + SWA(RMSNorm(x + m))

The cache holds the memory's and the sliding window's caches (``memory``, ``attention``).
"""

from __future__ import annotations

import torch
from torch import nn

from .atlas import Atlas
from .attention import Attention
from .layers import RMSNorm


def _sliding_window(model: dict) -> Attention:
    return Attention(model, window=model["swa"]["window"], num_sinks=model["swa"]["num_sinks"])


def _branch_caches(cache: dict | None):
    if cache is None:
        return None, None
    return cache.setdefault("memory", {}), cache.setdefault("attention", {})


class AtlasMAG(nn.Module):
    def __init__(self, model: dict):
        super().__init__()
        self.memory, self.attention = Atlas(model), _sliding_window(model)
        self.gate = nn.Linear(model["d_model"], model["d_model"], bias=True)

    def forward(self, x, positions, cache=None):
        memory_cache, attention_cache = _branch_caches(cache)
        memory = self.memory(x, positions, memory_cache)[0]
        attended = self.attention(x, positions, attention_cache)[0]
        gate = torch.sigmoid(self.gate(x))
        return gate * attended + (1 - gate) * memory, cache


class AtlasMAL(nn.Module):
    def __init__(self, model: dict):
        super().__init__()
        self.memory, self.attention = Atlas(model), _sliding_window(model)
        self.attention_norm = RMSNorm(model["d_model"], model["norm_eps"])

    def forward(self, x, positions, cache=None):
        memory_cache, attention_cache = _branch_caches(cache)
        memory = self.memory(x, positions, memory_cache)[0]
        attended = self.attention(self.attention_norm(x + memory), positions, attention_cache)[0]
        return memory + attended, cache


MIXERS = {"atlas_mag": AtlasMAG, "atlas_mal": AtlasMAL}
