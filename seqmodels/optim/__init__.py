"""Optimizers: Muon on the fused Newton–Schulz kernel (with AdamW for non-matrix parameters)."""

from seqmodels.optim.muon import default_muon_mask, muon

__all__ = ["default_muon_mask", "muon"]
