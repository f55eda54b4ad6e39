"""Atlas hybrids with sliding-window attention (the Titans paper's MAG and MAL layouts), as mixers.

``atlas_mag`` (memory as a gate): both branches read the same input and a learned gate mixes them,

    g = sigmoid(W_gate x + bias)                  [B, T, d_model]
    y = g * SWA(x) + (1 - g) * Atlas(x)

``atlas_mal`` (memory as a layer): the memory layer, then sliding-window attention over its output,
both in residual form inside one mixer (the block adds x back):

    m = Atlas(x)
    y = m + SWA(RMSNorm(x + m))                   so  x + y = (x + m) + SWA(RMSNorm(x + m))

SWA is the ``swa`` mixer (``model.swa.window`` and ``num_sinks``); Atlas the ``atlas`` mixer
(``model.atlas``). Decoding caches hold both branches' caches. With the sequence split over
``mesh.context`` each branch runs its own split form (the memory's shards in sequence, the window by a halo).

FLOPs per token: the two mixers' formulas, plus ``2 d_model^2`` for the MAG gate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from seqmodels.config_model import ModelConfigBase
from seqmodels.layers.common import Dense
from seqmodels.layers.norms import RMSNorm
from seqmodels.mixers.atlas import CONTEXT_NOTE, Atlas, atlas_flops
from seqmodels.mixers.attention import Attention
from seqmodels.mixers.registry import mixer_flops_per_token, register

HYBRID_SECTIONS = ("atlas", "attention", "swa")  # the memory branch and the sliding window


def _sliding_window(config: ModelConfigBase, rngs: nnx.Rngs) -> Attention:
    return Attention(config, window=config.swa.window, num_sinks=config.swa.num_sinks, rngs=rngs)


class _Hybrid(nnx.Module):
    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        self.memory = Atlas(config, rngs=rngs)
        self.attention = _sliding_window(config, rngs)

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        return {"memory": self.memory.init_cache(batch_size, max_len, dtype),
                "attention": self.attention.init_cache(batch_size, max_len, dtype)}


class AtlasMAG(_Hybrid):
    """Memory and sliding-window attention side by side, mixed by a learned elementwise gate."""

    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.gate = Dense(config.d_model, config.d_model, "embed", None, rngs=rngs, std=config.init_std,
                          use_bias=True)

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        caches = cache or {"memory": None, "attention": None}
        memory, memory_cache = self.memory(x, segment_ids=segment_ids, positions=positions, cache=caches["memory"])
        attended, attention_cache = self.attention(x, segment_ids=segment_ids, positions=positions,
                                                   cache=caches["attention"])
        gate = jax.nn.sigmoid(self.gate(x))
        y = gate * attended + (1 - gate) * memory
        return y, None if cache is None else {"memory": memory_cache, "attention": attention_cache}


class AtlasMAL(_Hybrid):
    """The memory layer, then sliding-window attention on its (residual) output."""

    def __init__(self, config: ModelConfigBase, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.attention_norm = RMSNorm(config.d_model, eps=config.norm_eps)

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        caches = cache or {"memory": None, "attention": None}
        memory, memory_cache = self.memory(x, segment_ids=segment_ids, positions=positions, cache=caches["memory"])
        attended, attention_cache = self.attention(self.attention_norm(x + memory), segment_ids=segment_ids,
                                                   positions=positions, cache=caches["attention"])
        return memory + attended, None if cache is None else {"memory": memory_cache, "attention": attention_cache}


def _hybrid_flops(config: ModelConfigBase, seq_len: int, gate: bool) -> float:
    flops = atlas_flops(config, seq_len) + mixer_flops_per_token("swa", config, seq_len)
    return flops + (2 * config.d_model**2 if gate else 0)


register("atlas_mag", lambda config, rngs: AtlasMAG(config, rngs=rngs),
         lambda config, seq_len: _hybrid_flops(config, seq_len, gate=True), sections=HYBRID_SECTIONS,
         context_parallel=True, context_note=CONTEXT_NOTE)
register("atlas_mal", lambda config, rngs: AtlasMAL(config, rngs=rngs),
         lambda config, seq_len: _hybrid_flops(config, seq_len, gate=False), sections=HYBRID_SECTIONS,
         context_parallel=True, context_note=CONTEXT_NOTE)
