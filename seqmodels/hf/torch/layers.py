"""Shared PyTorch layers of the exported seqmodels architectures (the JAX ``seqmodels.layers``, in torch).

Every layer holds its parameters under the JAX module's attribute names, so an export's tensor
names are the JAX parameter paths (``weight`` for a dense kernel, a convolution weight or a norm
scale). Layouts (``seqmodels.hf.remote_code``): a JAX ``Dense`` kernel ``[in, *out]`` is an
``nn.Linear`` weight ``[prod(out), in]`` (its outputs flattened in the JAX order), a ``DenseOut``
kernel ``[*in, out]`` is ``[out, prod(in)]``, a ``ShortConv`` weight ``[K, C]`` (lag-major) is a depthwise
``conv1d`` weight ``[C, 1, K]`` (time-major: ``weight[c, 0, K - 1 - lag] = w[lag, c]``).

    RMSNorm:    y = x / sqrt(mean(x^2) + eps) * weight     (float32; with a gate: y * silu(gate))
    ShortConv:  y_t[c] = bias[c] + sum_{lag < K} w[lag, c] x_{t - lag}[c]     (causal, per channel)
    SwiGLU:     y = down(silu(gate(x)) * up(x))
    RoPE:       pairs (x[i], x[i + D/2]) rotated by position * theta^(-2i/D)

Padded batches: every twin takes ``positions [B, T]``, each real token's position in its own row and
``PAD_POSITION`` (-1) at padding (``row_positions``). Padding is neither read nor written: a ``ShortConv``
reads the last ``K - 1`` real inputs of the row (``valid``), a recurrence leaves its state unchanged at a
padded step, attention never sees a padded key.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import KernelChoice, causal_conv

PAD_POSITION = -1


def row_positions(valid: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: ``start [B]`` + the real tokens before each real token of its row; ``PAD_POSITION`` where
    ``valid [B, T]`` (bool) is False."""
    counted = start[:, None] + torch.cumsum(valid.long(), dim=1) - 1
    return torch.where(valid, counted, torch.full_like(counted, PAD_POSITION))


def real_tokens(positions: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: which entries of ``positions`` are tokens, not padding."""
    return positions != PAD_POSITION


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(||x||^2 + eps)`` over the last axis, in float32."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.square().sum(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(features))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        y = rms_normalize(x, self.eps) * self.weight.float()
        if gate is not None:
            y = y * F.silu(gate.float())
        return y.to(x.dtype)


class ShortConv(KernelChoice, nn.Module):
    """Causal depthwise convolution over ``[B, T, C]``; the cache holds the last ``K - 1`` inputs. On CUDA a
    call without padding runs causal_conv1d's kernel where installed (``kernels.py``)."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.find_kernels("causal_conv1d")

    def forward(self, x: torch.Tensor, history: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """``(y [B, T, C], the new history [B, K - 1, C])``; ``history`` None means zeros (a fresh row).

        With ``valid [B, T]`` (bool) each real input reads the last ``K - 1`` real inputs before it (the
        history's included) and the history becomes the row's last ``K - 1`` real inputs: each row's real
        inputs are moved, in order, to the end of ``[history, x]`` (padding first, zeroed), convolved there
        and put back; padded outputs are zero."""
        batch, length, channels = x.shape
        if history is None:
            history = x.new_zeros(batch, self.kernel_size - 1, channels)
        full = torch.cat([history.to(x.dtype), x], dim=1)
        if valid is not None and bool(valid.all()):
            valid = None  # no padding: the packing below would be the identity
        if valid is not None:
            keep = torch.cat([valid.new_ones(batch, self.kernel_size - 1), valid], dim=1)
            order = torch.argsort(keep.to(torch.int8), dim=1, stable=True)  # padding first, then the real inputs
            full = torch.gather(full * keep[..., None].to(x.dtype), 1, order[..., None].expand(-1, -1, channels))
        weight = self.weight.to(x.dtype)[:, 0]  # [C, K]
        y = None if valid is not None else causal_conv(self, full, weight, self.bias.to(x.dtype))
        if y is None:  # the depthwise convolution as K shifted multiply-adds (y_t = b + sum_k w_k full_{t+k}),
            # accumulated in place: the same sum as F.conv1d(groups=channels), 3-4x faster on a CPU thread
            y = torch.addcmul(self.bias.to(x.dtype), full[:, :length], weight[:, 0])
            for k in range(1, self.kernel_size):
                y.addcmul_(full[:, k:k + length], weight[:, k])
        if valid is not None:  # packed slot of x's input t: where order put it, less the K - 1 leading slots
            slot = torch.argsort(order, dim=1)[:, self.kernel_size - 1:] - (self.kernel_size - 1)
            y = torch.gather(y, 1, slot.clamp_min(0)[..., None].expand(-1, -1, channels))
            y = torch.where(valid[..., None], y, torch.zeros_like(y))
        return y, full[:, full.shape[1] - (self.kernel_size - 1):]


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """``x [B, T, H, D]`` rotated at ``positions [B, T]`` or ``[T]`` (the half-split layout), in float32, back in
    x.dtype."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.float()[..., None] * inv_freq  # [B, T, D/2] or [T, D/2]
    angles = angles if angles.ndim == 3 else angles[None]
    cos, sin = torch.cos(angles)[:, :, None, :], torch.sin(angles)[:, :, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def sinusoidal_positions(positions: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    """``[..., dim]`` features ``(sin(p w_i), cos(p w_i))``, ``w_i = theta^(-2i/dim)`` (sines first)."""
    half = dim // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float32, device=positions.device) / half)
    angles = positions.float()[..., None] * inv_freq
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def step_and_log_decay(dt: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor):
    """``(Delta, log_decay)`` float32: ``Delta = softplus(dt + dt_bias)``, ``log_decay = -exp(A_log) Delta``."""
    delta = F.softplus(dt.float() + dt_bias.float())
    return delta, -torch.exp(a_log.float()) * delta


def mlp_hidden(model: dict) -> int:
    """SwiGLU width: ``model.d_ff``, or 8/3 d_model rounded up to a multiple of 64 (``ModelConfig.mlp_hidden``)."""
    return model["d_ff"] or -(-(8 * model["d_model"] // 3) // 64) * 64
