"""Newton-Schulz in PyTorch (the JAX ``pallas_kernels.newton_schulz`` and ``momentum_scan.conditioning``).

    X_0 = x / (norm_scale ||x||_F + eps)  (0 when x = 0),   X_{j+1} = a_j X_j + (b_j A_j + c_j A_j^2) X_j,  A_j = X_j X_j^T

on ``x [..., M, N]`` (transposed first when M > N), float32. The per-step ``(a, b, c)`` and ``norm_scale``
of a schedule (``muon``, ``polar_express``) come from ``newton_schulz_coefficients``: the JAX kernels'
own ``pallas_kernels/newton_schulz/coefficients.py``, copied into every export. For a rank-1 ``U`` (one singular
value ``||U||_F``) ``NS_k(U) = r_k U``: ``rank_one_scale``; for a block-diagonal matrix of rank-1
blocks normalised together: ``block_rank_one_scale``.
"""

from __future__ import annotations

import torch

from .newton_schulz_coefficients import resolve_coefficients


def newton_schulz(x: torch.Tensor, *, steps: int, coefficients: str, eps: float = 1e-7) -> torch.Tensor:
    """The iteration of the module docstring on every matrix of ``x [..., M, N]`` (float32)."""
    table, norm_scale = resolve_coefficients(coefficients, steps)
    transpose = x.shape[-2] > x.shape[-1]
    matrix = x.float().transpose(-1, -2) if transpose else x.float()
    sum_squares = matrix.square().sum(dim=(-2, -1), keepdim=True)
    nonzero = sum_squares > 0
    norm = torch.sqrt(torch.where(nonzero, sum_squares, torch.ones_like(sum_squares)))
    matrix = torch.where(nonzero, matrix / (norm_scale * norm + eps), torch.zeros_like(matrix))
    for a, b, c in table:
        gram = matrix @ matrix.transpose(-1, -2)
        matrix = a * matrix + (b * gram + c * (gram @ gram)) @ matrix
    return matrix.transpose(-1, -2) if transpose else matrix


def _polynomials(singular: torch.Tensor, ratio: torch.Tensor, table) -> torch.Tensor:
    for a, b, c in table:
        squared = singular * singular
        multiplier = a + squared * (b + c * squared)
        singular, ratio = singular * multiplier, ratio * multiplier
    return ratio


def rank_one_scale(sum_squares: torch.Tensor, *, steps: int, coefficients: str, eps: float) -> torch.Tensor:
    """``r`` with ``NS_k(U) = r U`` for rank-1 ``U`` with ``||U||_F^2 = sum_squares``; 1 when ``steps = 0``."""
    if steps == 0:
        return torch.ones_like(sum_squares, dtype=torch.float32)
    table, norm_scale = resolve_coefficients(coefficients, steps)
    norm = torch.sqrt(sum_squares.float().clamp_min(0))
    ratio = 1.0 / (norm_scale * norm + eps)
    return _polynomials(norm * ratio, ratio, table)


def block_rank_one_scale(sum_squares: torch.Tensor, *, steps: int, coefficients: str, eps: float) -> torch.Tensor:
    """``r_h`` with ``NS_k(diag(U_h)) = diag(r_h U_h)``; ``sum_squares [..., H]`` holds ``||U_h||_F^2``."""
    if steps == 0:
        return torch.ones_like(sum_squares, dtype=torch.float32)
    table, norm_scale = resolve_coefficients(coefficients, steps)
    sum_squares = sum_squares.float().clamp_min(0)
    total = torch.sqrt(sum_squares.sum(-1, keepdim=True))
    ratio = (1.0 / (norm_scale * total + eps)).expand_as(sum_squares)
    return _polynomials(torch.sqrt(sum_squares) * ratio, ratio, table)
