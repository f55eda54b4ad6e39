"""Pallas kernels for the hot loops of seqmodels. Imports jax only, never seqmodels.

One folder per op (``reference.py``, ``xla.py``, ``triton.py``, ``__init__.py``); see each op's
docstring for its definition and shapes.
"""

from pallas_kernels.chunk_gla import chunk_gla
from pallas_kernels.gated_delta_rule import gated_delta_rule
from pallas_kernels.linear_scan import linear_scan
from pallas_kernels.newton_schulz import newton_schulz

__all__ = ["chunk_gla", "gated_delta_rule", "linear_scan", "newton_schulz"]
