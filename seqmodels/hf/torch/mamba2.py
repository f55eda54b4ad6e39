"""Mamba2 (SSD) in PyTorch: the JAX ``seqmodels.mixers.mamba2``.

Per token t (heads H of P channels, state N; B and C shared by the heads)::

    x, B, C = silu(conv(W_x u)), silu(conv(W_B u)), silu(conv(W_C u));  Delta = softplus(W_dt u + dt_bias)
    h_t = exp(Delta A) h_{t-1} + B (Delta x)^T;  y = h_t^T C + D x
    out = W_out RMSNorm(y * silu(z))    (after_gate, all H P channels)  or  RMSNorm(y) * silu(z) per head

Calls of more than one token run the chunked SSD (``kernels.ssd``: mamba_ssm's ``mamba_chunk_scan_combined`` or fla's
``chunk_simple_gla`` on CUDA where installed, else ``chunked.chunk_gated_linear``, B and C broadcast to the heads),
one decoded token the recurrent step; ``scan_form`` picks (``chunked.ScanForm``). The cache holds the convolutions' last inputs and the state; a fresh (empty) dict starts a row. Padding
(``positions`` -1) is skipped by the convolutions and leaves the state unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .chunked import ScanForm
from .kernels import KernelChoice, gated_linear, ssd
from .layers import RMSNorm, ShortConv, real_tokens, step_and_log_decay
from .recurrences import cached_state, conv_with_cache, keep_real


class Mamba2(ScanForm, KernelChoice, nn.Module):
    def __init__(self, model: dict):
        super().__init__()
        settings, width = model["mamba2"], model["d_model"]
        inner = settings["expand"] * width
        head_dim = settings["head_dim"] or inner // model["num_heads"]
        heads, state_dim = inner // head_dim, settings["state_dim"]
        self.heads, self.head_dim, self.state_dim = heads, head_dim, state_dim
        self.gate = nn.Linear(width, heads * head_dim, bias=False)
        self.x_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.b_proj = nn.Linear(width, state_dim, bias=False)
        self.c_proj = nn.Linear(width, state_dim, bias=False)
        self.dt_proj = nn.Linear(width, heads, bias=False)
        kernel = settings["conv_kernel"]
        self.x_conv = ShortConv(heads * head_dim, kernel)
        self.b_conv, self.c_conv = ShortConv(state_dim, kernel), ShortConv(state_dim, kernel)
        self.a_log, self.dt_bias = nn.Parameter(torch.zeros(heads)), nn.Parameter(torch.zeros(heads))
        self.skip = nn.Parameter(torch.ones(heads))
        self.norm_after_gate = settings["gated_norm"] == "after_gate"
        self.norm = RMSNorm(heads * head_dim if self.norm_after_gate else head_dim, model["norm_eps"])
        self.out = nn.Linear(heads * head_dim, width, bias=False)
        self.find_kernels("ssd", "simple_gla")

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        valid = real_tokens(positions)  # a recurrence: only which tokens are real matters
        batch, length = x.shape[:2]
        ssm_input = F.silu(conv_with_cache(self.x_conv, self.x_proj(x), cache, "conv_x", valid))
        ssm_input = ssm_input.reshape(batch, length, self.heads, self.head_dim).float()
        b = F.silu(conv_with_cache(self.b_conv, self.b_proj(x), cache, "conv_b", valid)).float()
        c = F.silu(conv_with_cache(self.c_conv, self.c_proj(x), cache, "conv_c", valid)).float()
        delta, log_decay = step_and_log_decay(self.dt_proj(x), self.dt_bias, self.a_log)
        y = self.scan(c, b, ssm_input, delta, log_decay, cache, valid)
        y = y + self.skip.float()[:, None] * ssm_input
        gate = self.gate(x).reshape(batch, length, self.heads, self.head_dim)
        if self.norm_after_gate:
            y = self.norm((y * F.silu(gate.float())).reshape(batch, length, -1))
        else:
            y = self.norm(y, gate=gate).reshape(batch, length, -1)
        return self.out(y.to(x.dtype)), cache

    def _states(self, cache, names, q):
        shape = (q.shape[0], self.heads, self.state_dim, self.head_dim)
        return [cached_state(cache, name, shape, q.device) for name in names]

    def scan(self, c, b, x, delta, log_decay, cache, valid):
        """``y [B, T, H, P]`` of the SSD: mamba_ssm's kernel for a chunked call where the layer has it, else
        ``recurrence`` of the injections ``Delta x``."""
        kernel = self.kernel("ssd", x) if self.chunked(x.shape[1]) else None
        if kernel is None:
            return self.recurrence(c, b, delta[..., None] * x, log_decay, cache, valid)
        (state,) = self._states(cache, ("state",), c)
        y, state = ssd(kernel, c, b, x, delta, -torch.exp(self.a_log.float()), state, valid, chunk_size=self.chunk_size)
        if cache is not None:
            cache["state"] = state
        return y

    def recurrence(self, q, k, v, log_decay, cache, valid):
        """``y [B, T, H, P]``: ``h = e^g h + k v^T; y = h^T q`` per real token (q = C, k = B shared by the heads)."""
        (state,), outputs = self._states(cache, ("state",), q), []
        if self.chunked(q.shape[1]):
            shared = (q.shape[0], q.shape[1], self.heads, self.state_dim)
            y, state = gated_linear(self, q[:, :, None].expand(shared), k[:, :, None].expand(shared), v, log_decay,
                                    state, valid, chunk_size=self.chunk_size, scale=1.0)
            if cache is not None:
                cache["state"] = state
            return y
        for t in range(q.shape[1]):
            new = torch.exp(log_decay[:, t])[..., None, None] * state + k[:, t, None, :, None] * v[:, t, :, None, :]
            state = keep_real(valid, t, new, state)
            outputs.append(torch.einsum("bn,bhnp->bhp", q[:, t], state))
        if cache is not None:
            cache["state"] = state
        return torch.stack(outputs, dim=1)


MIXERS = {"mamba2": Mamba2}
