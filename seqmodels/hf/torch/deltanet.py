"""DeltaNet and Gated DeltaNet in PyTorch: the JAX ``seqmodels.mixers.deltanet``.

Per token t (heads H, key K, value V)::

    q, k, v = silu(conv(W x)), q, k <- q / ||q||, k / ||k||;  beta = sigmoid(W_beta x)
    g = -exp(A_log) softplus(W_a x + dt_bias)   (gated; 0 for DeltaNet)
    S_t = e^g (I - beta k k^T) S_{t-1} + beta k v^T;  o = K^-1/2 S_t^T q
    out = W_out(RMSNorm(o) * silu(W_g x))                           (per head over V)

Calls of more than one token run the chunk-parallel WY form (``chunked.chunk_delta_rule``, or fla's
``chunk_gated_delta_rule`` / ``chunk_delta_rule`` on CUDA where installed: ``kernels.py``), one decoded token
the recurrent step (``recurrences.delta_rule_scan``); ``scan_form`` picks (``chunked.ScanForm``). The cache holds the convolutions' last inputs and the state; a fresh (empty) dict starts a row. Padding
(``positions`` -1) is skipped by the convolutions and leaves the state unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .chunked import ScanForm
from .kernels import KernelChoice, delta_rule
from .layers import RMSNorm, ShortConv, l2_normalize, real_tokens, step_and_log_decay
from .recurrences import cached_state, conv_with_cache, delta_rule_scan


class DeltaNet(ScanForm, KernelChoice, nn.Module):
    def __init__(self, model: dict, *, gated: bool):
        super().__init__()
        settings, width = model["deltanet"], model["d_model"]
        heads = model["num_heads"]
        key_dim = settings["head_dim"] or width // heads
        value_dim = settings["value_head_dim"] or key_dim
        self.heads, self.key_dim, self.value_dim, self.gated = heads, key_dim, value_dim, gated
        self.query = nn.Linear(width, heads * key_dim, bias=False)
        self.key = nn.Linear(width, heads * key_dim, bias=False)
        self.value = nn.Linear(width, heads * value_dim, bias=False)
        self.beta_proj = nn.Linear(width, heads, bias=False)
        self.gate = nn.Linear(width, heads * value_dim, bias=False)
        kernel = settings["conv_kernel"]
        self.q_conv, self.k_conv = ShortConv(heads * key_dim, kernel), ShortConv(heads * key_dim, kernel)
        self.v_conv = ShortConv(heads * value_dim, kernel)
        if gated:
            self.decay_proj = nn.Linear(width, heads, bias=False)
            self.a_log = nn.Parameter(torch.zeros(heads))
            self.dt_bias = nn.Parameter(torch.zeros(heads))
        self.norm = RMSNorm(value_dim, model["norm_eps"])
        self.out = nn.Linear(heads * value_dim, width, bias=False)
        self.find_kernels("gated_delta_rule" if gated else "delta_rule")

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        valid = real_tokens(positions)  # a recurrence: only which tokens are real matters
        batch, length = x.shape[:2]
        shape = (batch, length, self.heads, -1)
        q = F.silu(conv_with_cache(self.q_conv, self.query(x), cache, "conv_q", valid)).reshape(shape)
        k = F.silu(conv_with_cache(self.k_conv, self.key(x), cache, "conv_k", valid)).reshape(shape)
        v = F.silu(conv_with_cache(self.v_conv, self.value(x), cache, "conv_v", valid)).reshape(shape).float()
        q, k = l2_normalize(q), l2_normalize(k)
        beta = torch.sigmoid(self.beta_proj(x).float())
        if self.gated:
            log_decay = step_and_log_decay(self.decay_proj(x), self.dt_bias, self.a_log)[1]
        else:
            log_decay = torch.zeros_like(beta)
        o = self.recurrence(q, k, v, beta, log_decay, cache, valid)
        o = self.norm(o.to(x.dtype), gate=self.gate(x).reshape(shape))
        return self.out(o.reshape(batch, length, -1)), cache

    def recurrence(self, q, k, v, beta, log_decay, cache, valid):
        """``o [B, T, H, V]`` of the delta rule from the cached state (``valid [B, T]``: the real tokens)."""
        state = cached_state(cache, "state", (q.shape[0], self.heads, self.key_dim, self.value_dim), q.device)
        if self.chunked(q.shape[1]):
            o, state = delta_rule(self, q, k, v, beta, log_decay, state, valid, chunk_size=self.chunk_size,
                                  gated=self.gated)
        else:
            o, state = delta_rule_scan(q, k, v, beta, log_decay, state, valid)
        if cache is not None:
            cache["state"] = state
        return o


MIXERS = {"deltanet": lambda model: DeltaNet(model, gated=False),
          "gated_deltanet": lambda model: DeltaNet(model, gated=True)}
