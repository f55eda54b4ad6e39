"""Pallas kernels for the hot loops of seqmodels. Imports jax only, never seqmodels.

One folder per op (``reference.py``, ``xla.py``, ``triton.py``, ``__init__.py``); see each op's
docstring for its definition and shapes. The baselines' recurrences (``linear_scan``, ``chunk_gla``,
``gated_delta_rule``), the orthogonalisation (``newton_schulz``), Atlas's memory recurrence
(``atlas_memory``) and MuonSSM's momentum scans (``momentum_scan``); ``_chunks.py`` holds the chunk
layout the chunked forms share, ``_common.py`` the argument checks and impl dispatch.
"""

from pallas_kernels.chunk_gla import chunk_gla
from pallas_kernels.gated_delta_rule import gated_delta_rule
from pallas_kernels.linear_scan import linear_scan
from pallas_kernels.newton_schulz import newton_schulz
from pallas_kernels.atlas_memory import atlas_memory, atlas_memory_step  # noqa: E402  (composes the ops above)
from pallas_kernels.momentum_scan import momentum_delta_rule, momentum_scalar_decay  # noqa: E402

__all__ = ["atlas_memory", "atlas_memory_step", "chunk_gla", "gated_delta_rule", "linear_scan", "momentum_delta_rule",
           "momentum_scalar_decay", "newton_schulz"]
