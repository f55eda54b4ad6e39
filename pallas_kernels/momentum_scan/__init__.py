"""Momentum scans: a linear recurrence whose input passes through a momentum state first (MuonSSM).

Per batch row and head, states ``S, M: [K, V]`` (float32), with the momentum ``M`` injected into
the backbone's state ``S``::

    momentum_scalar_decay:  M_t = e^{h_t} M_{t-1} + k_t v_t^T,   S_t = e^{g_t} S_{t-1} + M_t
    momentum_delta_rule:    M_t = e^{h_t} M_{t-1} + k_t w_t^T,   S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + M_t
    o_t = scale * S_t^T q_t

Shapes follow the other ops: ``q, k: [B, T, H, K]``, ``v`` / ``w: [B, T, H, V]``, per-head gates
``beta``, log decays ``g`` (``log_decay``) and ``h`` (``log_momentum_decay``) ``[B, T, H]`` (<= 0; a
document boundary is a log decay of about -30 on both), states ``[B, H, K, V]``. Each returns
``(o [B, T, H, V] in q.dtype, S_final, M_final)``.

Implementations (``impl``): ``reference`` (``reference.py``: token by token, ``lax.scan``; also the
one-token decoding step), ``xla`` (``xla.py``: the chunk-parallel forms, derivations there). There is
no Pallas kernel yet: ``pallas`` and ``auto`` run the ``xla`` form on every platform (a fused kernel
comes when a profile asks for one). Gradients are JAX autodiff of the chosen form.

``conditioning.py`` holds the Newton-Schulz closed forms for low-rank injections (``rank_one_scale``,
``block_rank_one_scale``, ``low_rank_newton_schulz``) with which MuonSSM conditions ``k_t v_t^T`` before the momentum.
"""

from __future__ import annotations

from pallas_kernels import _common
from pallas_kernels.momentum_scan import reference, xla
from pallas_kernels.momentum_scan.conditioning import block_rank_one_scale, low_rank_newton_schulz, rank_one_scale

__all__ = ["block_rank_one_scale", "low_rank_newton_schulz", "momentum_delta_rule", "momentum_scalar_decay",
           "rank_one_scale"]


def _check(q, k, values, gates: dict, initial_state, initial_momentum, scale, chunk_size) -> None:
    batch, length, heads, key_dim = _common.check_qkv(q, k, values, **gates)
    for name, gate in gates.items():
        _common.check_shape(name, gate, (batch, length, heads), "[B, T, H]")
    state_shape = (batch, heads, key_dim, values.shape[-1])
    for name, state in (("initial_state", initial_state), ("initial_momentum", initial_momentum)):
        if state is not None:
            _common.check_float(name, state)
            _common.check_shape(name, state, state_shape, "[B, H, K, V]")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise ValueError(f"scale must be a Python float, got {scale!r}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")


def momentum_scalar_decay(q, k, v, log_decay, log_momentum_decay, *, scale: float, initial_state=None,
                          initial_momentum=None, chunk_size: int = 64, impl: str = "auto"):
    """``(o, S_final, M_final)`` of the scalar-decay momentum scan (module docstring).

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
      log_decay, log_momentum_decay: ``[B, T, H]``, ``g`` and ``h`` (<= 0).
      scale: multiplies every output.
      initial_state, initial_momentum: ``[B, H, K, V]`` states before the first token (zeros if None).
      chunk_size: tokens per chunk of the ``xla`` form.
      impl: ``"auto" | "reference" | "xla" | "pallas"``.
    """
    _check(q, k, v, {"log_decay": log_decay, "log_momentum_decay": log_momentum_decay}, initial_state,
           initial_momentum, scale, chunk_size)
    states = dict(initial_state=initial_state, initial_momentum=initial_momentum)
    if _common.resolve_impl(impl, _common.KERNEL_PLATFORMS) == "reference":
        return reference.scalar_decay(q, k, v, log_decay, log_momentum_decay, scale=scale, **states)
    return xla.scalar_decay(q, k, v, log_decay, log_momentum_decay, scale=scale, chunk_size=chunk_size, **states)


def momentum_delta_rule(q, k, w, beta, log_decay, log_momentum_decay, *, scale: float, initial_state=None,
                        initial_momentum=None, chunk_size: int = 64, impl: str = "auto"):
    """``(o, S_final, M_final)`` of the delta rule with a momentum input (module docstring).

    Args:
      q, k: ``[B, T, H, K]`` (k L2-normalised); w: ``[B, T, H, V]``, the injection ``W_t = k_t w_t^T``.
      beta: ``[B, T, H]`` write strengths; log_decay, log_momentum_decay: ``[B, T, H]`` (<= 0).
      scale, initial_state, initial_momentum, chunk_size, impl: as ``momentum_scalar_decay``.
    """
    _check(q, k, w, {"beta": beta, "log_decay": log_decay, "log_momentum_decay": log_momentum_decay},
           initial_state, initial_momentum, scale, chunk_size)
    states = dict(initial_state=initial_state, initial_momentum=initial_momentum)
    if _common.resolve_impl(impl, _common.KERNEL_PLATFORMS) == "reference":
        return reference.delta_rule(q, k, w, beta, log_decay, log_momentum_decay, scale=scale, **states)
    return xla.delta_rule(q, k, w, beta, log_decay, log_momentum_decay, scale=scale, chunk_size=chunk_size,
                          **states)
