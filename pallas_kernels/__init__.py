"""Pallas kernels for the hot loops of seqmodels. Imports jax only, never seqmodels.

One folder per op (``reference.py``, ``xla.py``, ``triton.py``, ``__init__.py``); see each op's
docstring for its definition and shapes.
"""

from pallas_kernels.linear_scan import linear_scan

__all__ = ["linear_scan"]
