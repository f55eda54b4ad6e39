"""LongHorn in PyTorch, in its recurrent form: the JAX ``seqmodels.mixers.longhorn``.

Per token t (channels D, state N per channel)::

    u = silu(conv(W_u x)), k, q = W_k u, W_q u;  dt = sigmoid(W_up W_down u + t_bias);  T = dt / (1 + dt ||k||^2)
    h_t = (1 - T k^2) * h_{t-1} + (T u) k^T;  y = h_t q + D_skip u;  out = W_out(y * silu(z))

Calls of more than one token run the chunk form of the diagonal scan (``chunked.chunk_diagonal_scan``), one
decoded token the recurrent step; ``scan_form`` picks (``chunked.ScanForm``). The cache holds the convolution's
last inputs and the state; a fresh (empty) dict starts a row. Padding (``positions`` -1) is skipped by the
convolution and leaves the state unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .chunked import ScanForm, chunk_diagonal_scan
from .layers import ShortConv, real_tokens
from .recurrences import cached_state, conv_with_cache, keep_real


class LongHorn(ScanForm, nn.Module):
    def __init__(self, model: dict):
        super().__init__()
        settings, width = model["longhorn"], model["d_model"]
        channels, state_dim = settings["expand"] * width, settings["state_dim"]
        rank = settings["dt_rank"] or math.ceil(width / 16)
        self.channels, self.state_dim = channels, state_dim
        self.in_proj = nn.Linear(width, 2 * channels, bias=False)
        self.conv = ShortConv(channels, settings["conv_kernel"])
        self.kq_proj = nn.Linear(channels, 2 * state_dim, bias=False)
        self.dt_down = nn.Linear(channels, rank, bias=False)
        self.dt_up = nn.Linear(rank, channels, bias=False)
        self.t_bias = nn.Parameter(torch.zeros(channels))
        self.skip = nn.Parameter(torch.ones(channels))
        self.out = nn.Linear(channels, width, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        valid = real_tokens(positions)  # a recurrence: only which tokens are real matters
        u, z = self.in_proj(x).split(self.channels, dim=-1)
        u = F.silu(conv_with_cache(self.conv, u, cache, "conv", valid))
        k, q = self.kq_proj(u).float().split(self.state_dim, dim=-1)
        dt = torch.sigmoid(self.dt_up(self.dt_down(u)).float() + self.t_bias.float())
        step = dt / (1.0 + dt * k.square().sum(-1, keepdim=True))  # [B, T, D]
        keep = 1.0 - step[..., None] * k.square()[:, :, None, :]  # [B, T, D, N]
        written = step * u.float()
        states = self.recurrence(keep, written, k, cache, valid)
        y = torch.einsum("btdn,btn->btd", states, q) + self.skip.float() * u.float()
        return self.out((y * F.silu(z.float())).to(x.dtype)), cache

    def recurrence(self, keep, written, k, cache, valid):
        """``h [B, T, D, N]``: ``h_t = keep_t * h_{t-1} + written_t k_t^T`` at real tokens, ``h_{t-1}`` at padding."""
        state = cached_state(cache, "state", (keep.shape[0], self.channels, self.state_dim), keep.device)
        if self.chunked(keep.shape[1]):
            states, state = chunk_diagonal_scan(keep, written[..., None] * k[:, :, None, :], state, valid,
                                                chunk_size=self.chunk_size)
            if cache is not None:
                cache["state"] = state
            return states
        states = []
        for t in range(keep.shape[1]):
            state = keep_real(valid, t, keep[:, t] * state + written[:, t, :, None] * k[:, t, None, :], state)
            states.append(state)
        if cache is not None:
            cache["state"] = state
        return torch.stack(states, dim=1)


MIXERS = {"longhorn": LongHorn}
