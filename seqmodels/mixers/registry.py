"""The mixer registry: name -> how to build it and how many FLOPs it costs; the ``Mixer`` interface.

A mixer (``Mixer`` below) is an ``nnx.Module`` with ``__call__(x, *, segment_ids=None,
positions=None, cache=None) -> (y, cache)`` over ``x: [B, T, d_model]`` and ``init_cache(batch_size,
max_len, dtype)``. Training calls it on whole sequences (``cache=None``; ``segment_ids [B, T]`` mark
the packed documents, 0 = padding, and ``positions [B, T]`` count within each document); decoding
passes the cache and one or more new tokens. The decoder LM (``models/lm.py``) and the looped
model's shared block (``models/looped.py``) build any registered mixer through this interface.

``flops_per_token(model_config, seq_len)`` is the *forward* matmul FLOPs per token of one layer of
the mixer (2 FLOPs per multiply-add), averaged over the ``seq_len`` positions of a row; each mixer
file documents its formula. Training counts 3x forward (backward = 2x forward). These feed MFU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import jax
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig


@runtime_checkable
class Mixer(Protocol):
    """What every registered mixer offers (module docstring)."""

    def __call__(self, x: jax.Array, *, segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
                 cache: Any = None) -> tuple[jax.Array, Any]:
        """``y [B, T, d_model]`` and the updated cache (None when ``cache`` is None)."""

    def init_cache(self, batch_size: int, max_len: int, dtype=...) -> Any:
        """The empty decoding cache for ``batch_size`` rows of up to ``max_len`` tokens."""


@dataclass(frozen=True)
class MixerEntry:
    build: Callable[[ModelConfig, nnx.Rngs], Mixer]
    flops_per_token: Callable[[ModelConfig, int], float]


MIXERS: dict[str, MixerEntry] = {}


def register(name: str, build, flops_per_token) -> None:
    if name in MIXERS:
        raise ValueError(f"mixer {name!r} is registered twice")
    MIXERS[name] = MixerEntry(build, flops_per_token)


def _entry(name: str, key: str = "model.mixers") -> MixerEntry:
    if name not in MIXERS:
        raise ConfigError(f"{key}: unknown mixer {name!r}; known mixers: {', '.join(sorted(MIXERS))}")
    return MIXERS[name]


def check_mixer_names(names, key: str = "model.mixers") -> None:
    """Raise ``ConfigError`` naming ``key`` and the first unknown mixer in ``names``."""
    for name in names:
        _entry(name, key)


def build_mixer(name: str, config: ModelConfig, rngs: nnx.Rngs) -> Mixer:
    return _entry(name).build(config, rngs)


def mixer_flops_per_token(name: str, config: ModelConfig, seq_len: int) -> float:
    return float(_entry(name).flops_per_token(config, seq_len))
