"""The PyTorch twin of every registered mixer, by name: the one lookup the export and the assemblies use.

Each twin module declares ``MIXERS = {name: build(model_section) -> nn.Module}`` for the mixers it holds
(as each JAX mixer file registers itself); a new mixer's twin adds its line to the imports below.
Every twin takes ``(x [B, T, D], positions [T], cache)`` and returns ``(y, cache)``; ``cache`` is None
(no decoding) or the layer's dict, empty before the first token and updated in place.
"""

from __future__ import annotations

from torch import nn

from .atlas import MIXERS as ATLAS
from .atlas_hybrids import MIXERS as ATLAS_HYBRIDS
from .attention import MIXERS as ATTENTION
from .deltanet import MIXERS as DELTANET
from .longhorn import MIXERS as LONGHORN
from .mamba2 import MIXERS as MAMBA2
from .muonssm import MIXERS as MUONSSM

# (``from .x import ...``, one line a module: the form transformers' remote-code loader follows to copy a file)
MIXERS = {**ATTENTION, **ATLAS, **ATLAS_HYBRIDS, **DELTANET, **MAMBA2, **LONGHORN, **MUONSSM}


def build_mixer(name: str, model: dict) -> nn.Module:
    if name not in MIXERS:
        raise ValueError(f"mixer {name!r} has no PyTorch module; exported mixers: {', '.join(sorted(MIXERS))}")
    return MIXERS[name](model)
