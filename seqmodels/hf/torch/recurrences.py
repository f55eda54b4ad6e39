"""The linear recurrences of the PyTorch twins, token by token in float32 (``pallas_kernels/<op>/reference.py``
written in torch), and the cache helpers of the recurrent mixers.

    delta_rule_scan     S_t = e^{g_t} S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = K^-1/2 S_t^T q_t
    gated_linear_scan   S_t = e^{g_t} S_{t-1} + k_t v_t^T;                            o_t = K^-1/2 S_t^T q_t

A mixer's cache is a dict: its convolutions' last inputs (``conv_with_cache``) and its states
(``cached_state``); a fresh (empty) dict starts a row. With ``valid [B, T]`` (bool; None: every token is
real) a padded step leaves the state as it was (``keep_real``).
"""

from __future__ import annotations

import torch

from .layers import ShortConv


def conv_with_cache(conv: ShortConv, x: torch.Tensor, cache: dict | None, name: str,
                    valid: torch.Tensor | None = None) -> torch.Tensor:
    y, history = conv(x, None if cache is None else cache.get(name), valid)
    if cache is not None:
        cache[name] = history
    return y

def cached_state(cache: dict | None, name: str, shape, device) -> torch.Tensor:
    if cache is not None and name in cache:
        return cache[name]
    return torch.zeros(shape, dtype=torch.float32, device=device)

def keep_real(valid: torch.Tensor | None, t: int, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` where token ``t`` of the row is real, else ``old`` (``[B, ...]``)."""
    if valid is None:
        return new
    return torch.where(valid[:, t].reshape((-1,) + (1,) * (new.ndim - 1)), new, old)


def delta_rule_scan(q, k, v, beta, log_decay, state, valid=None):
    """``(o [B, T, H, V], final state)``: per token ``S = e^g S; S += k (beta (v - S^T k))^T; o = K^-1/2 S^T q``
    (``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``beta, log_decay [B, T, H]``, ``state [B, H, K, V]`` float32)."""
    scale, outputs = q.shape[-1] ** -0.5, []
    for t in range(q.shape[1]):
        decayed = torch.exp(log_decay[:, t])[..., None, None] * state
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], decayed)
        update = beta[:, t, :, None] * (v[:, t] - predicted)
        state = keep_real(valid, t, decayed + k[:, t, :, :, None] * update[:, :, None, :], state)
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state

def gated_linear_scan(q, k, v, log_decay, state, valid=None):
    """``(o [B, T, H, V], final state)``: per token ``S = e^g S + k v^T; o = K^-1/2 S^T q`` (shapes as
    ``delta_rule_scan``; ``valid [B, T]`` as ``keep_real``)."""
    scale, outputs = q.shape[-1] ** -0.5, []
    for t in range(q.shape[1]):
        new = torch.exp(log_decay[:, t])[..., None, None] * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        state = keep_real(valid, t, new, state)
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state
