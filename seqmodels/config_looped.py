"""``model.looped``: the settings of ``model.kind: looped`` (``seqmodels.models.looped``), a looped padded
transformer for recognition tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seqmodels.config_base import _require, _require_at_least, _require_choices, describe


@dataclass(frozen=True)
class LoopedConfig:
    """``model.kind: looped``: a prelude, ONE shared block applied ``loops(N)`` times, a coda, a read-out at [CLS]."""

    prelude_layers: int = describe("distinct blocks before the loop (0-2)", 1)
    coda_layers: int = describe("distinct blocks after the loop (0-2)", 1)
    loop_schedule: Literal["log", "fixed"] = describe(
        "log: loops(N) = ceil(loops_scale * log2 N) + loops_offset | fixed: fixed_loops", "log")
    loops_scale: float = describe("c in loops(N) = ceil(c log2 N) + d", 1.0)
    loops_offset: int = describe("d in loops(N) = ceil(c log2 N) + d", 1)
    fixed_loops: int = describe("loop count when loop_schedule = fixed", 4)
    share_weights: bool = describe(
        "one block looped (true), or fixed_loops distinct blocks: a fixed-depth baseline (false; loop_schedule fixed)",
        True)
    reinject: bool = describe("add the prelude output to the block input at every loop", True)
    padding_scale: float = describe("a in P(N) = ceil(a N^e) padding tokens before [CLS]; 0 = no padding", 0.0)
    padding_exponent: float = describe("e in P(N) = ceil(a N^e)", 1.0)
    attention: Literal["causal", "bidirectional"] = describe(
        "attention of every block over the padded layout", "bidirectional")
    positions: Literal["rope", "rope+sinusoidal"] = describe(
        "rope: positions enter only through RoPE in attention | rope+sinusoidal: also fixed sinusoidal features of "
        "the padded-layout position added to the embeddings (absolute positions in the residual stream)", "rope")
    mixer: str = describe("the registered mixer of the looped block (attention, gated_deltanet, ...)", "attention")

    def __post_init__(self):
        _require_choices(self, "model.looped")
        for key in ("prelude_layers", "coda_layers"):
            value = getattr(self, key)
            _require(0 <= value <= 2, f"model.looped.{key}", f"must be 0, 1 or 2, got {value}")
        _require_at_least(self, "model.looped", loops_scale=0, fixed_loops=1)
        _require(self.share_weights or self.loop_schedule == "fixed", "model.looped.share_weights",
                 "false (distinct blocks) needs model.looped.loop_schedule=fixed")
        _require_at_least(self, "model.looped", padding_scale=0, padding_exponent=0)

