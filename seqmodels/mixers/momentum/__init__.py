"""Momentum recurrences of MuonSSM: pure functions, chunked training forms beside token-by-token oracles.

- ``scalar_decay``: ``M_t = e^{h_t} M_{t-1} + k_t v_t^T``, ``S_t = e^{g_t} S_{t-1} + M_t`` (Mamba2 backbone).
- ``delta_rule``: ``M_t = e^{h_t} M_{t-1} + k_t w_t^T``, ``S_t = e^{g_t}(I - beta_t k_t k_t^T) S_{t-1} + M_t``
  (Gated DeltaNet backbone).
- ``conditioning``: Newton-Schulz of rank-1 and rank-r injections through their factors.

Shapes follow ``pallas_kernels``: ``q, k: [B, T, H, K]``, values ``[B, T, H, V]``, gates ``[B, T, H]``,
states ``[B, H, K, V]`` float32, ``o_t = scale * S_t^T q_t``.
"""

from seqmodels.mixers.momentum.conditioning import low_rank_newton_schulz, rank_one_scale
from seqmodels.mixers.momentum.delta_rule import momentum_delta_rule, momentum_delta_rule_reference
from seqmodels.mixers.momentum.scalar_decay import momentum_scalar_decay, momentum_scalar_decay_reference

__all__ = ["low_rank_newton_schulz", "momentum_delta_rule", "momentum_delta_rule_reference",
           "momentum_scalar_decay", "momentum_scalar_decay_reference", "rank_one_scale"]
