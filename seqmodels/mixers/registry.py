"""The mixer registry: name -> how to build it and how many FLOPs it costs.

A mixer is an ``nnx.Module`` with ``__call__(x, *, segment_ids=None, positions=None, cache=None)
-> (y, cache)`` over ``x: [B, T, d_model]`` and ``init_cache(batch_size, max_len, dtype)``. Training
calls it on whole sequences (``cache=None``); decoding passes the cache and one or more new tokens.

``flops_per_token(model_config, seq_len)`` is the *forward* matmul FLOPs per token of one layer of
the mixer (2 FLOPs per multiply-add), averaged over the ``seq_len`` positions of a row; each mixer
file documents its formula. Training counts 3x forward (backward = 2x forward). These feed MFU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flax import nnx

from seqmodels.config import ConfigError, ModelConfig


@dataclass(frozen=True)
class MixerEntry:
    build: Callable[[ModelConfig, nnx.Rngs], nnx.Module]
    flops_per_token: Callable[[ModelConfig, int], float]


MIXERS: dict[str, MixerEntry] = {}


def register(name: str, build, flops_per_token) -> None:
    if name in MIXERS:
        raise ValueError(f"mixer {name!r} is registered twice")
    MIXERS[name] = MixerEntry(build, flops_per_token)


def _entry(name: str) -> MixerEntry:
    if name not in MIXERS:
        raise ConfigError(f"model.mixers: unknown mixer {name!r}; known mixers: {', '.join(sorted(MIXERS))}")
    return MIXERS[name]


def check_mixer_names(names) -> None:
    """Raise ``ConfigError`` naming the first unknown mixer in ``names``."""
    for name in names:
        _entry(name)


def build_mixer(name: str, config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return _entry(name).build(config, rngs)


def mixer_flops_per_token(name: str, config: ModelConfig, seq_len: int) -> float:
    return float(_entry(name).flops_per_token(config, seq_len))
