"""Newton-Schulz in PyTorch (the JAX ``pallas_kernels.newton_schulz`` and ``momentum_scan.conditioning``).

    X_0 = x / (norm_scale ||x||_F + eps)  (0 when x = 0),   X_{j+1} = a_j X_j + (b_j A_j + c_j A_j^2) X_j,  A_j = X_j X_j^T

on ``x [..., M, N]`` (transposed first when M > N), float32. Schedules: ``muon`` (3.4445, -4.7750,
2.0315) every step; ``polar_express`` (Amsel et al. 2025, Algorithm 1: every row but the last divided
by (1.01, 1.01^3, 1.01^5), the last repeated, ``norm_scale`` 1.01). For a rank-1 ``U`` (one singular
value ``||U||_F``) ``NS_k(U) = r_k U``: ``rank_one_scale``; for a block-diagonal matrix of rank-1
blocks normalised together: ``block_rank_one_scale``.
"""

from __future__ import annotations

import torch

MUON = (3.4445, -4.7750, 2.0315)
_POLAR_EXPRESS = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
_SAFETY = 1.01


def schedule(coefficients: str, steps: int):
    """``(per-step (a, b, c), norm_scale)`` of ``coefficients`` over ``steps`` steps."""
    if coefficients == "muon":
        return (MUON,) * steps, 1.0
    if coefficients == "polar_express":
        scaled = tuple((a / _SAFETY, b / _SAFETY**3, c / _SAFETY**5) for a, b, c in _POLAR_EXPRESS[:-1])
        table = scaled + _POLAR_EXPRESS[-1:]
        return table[:steps] + table[-1:] * max(0, steps - len(table)), _SAFETY
    raise ValueError(f"Newton-Schulz coefficients must be 'muon' or 'polar_express', got {coefficients!r}")


def newton_schulz(x: torch.Tensor, *, steps: int, coefficients: str, eps: float = 1e-7) -> torch.Tensor:
    """The iteration of the module docstring on every matrix of ``x [..., M, N]`` (float32)."""
    table, norm_scale = schedule(coefficients, steps)
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
    table, norm_scale = schedule(coefficients, steps)
    norm = torch.sqrt(sum_squares.float().clamp_min(0))
    ratio = 1.0 / (norm_scale * norm + eps)
    return _polynomials(norm * ratio, ratio, table)


def block_rank_one_scale(sum_squares: torch.Tensor, *, steps: int, coefficients: str, eps: float) -> torch.Tensor:
    """``r_h`` with ``NS_k(diag(U_h)) = diag(r_h U_h)``; ``sum_squares [..., H]`` holds ``||U_h||_F^2``."""
    if steps == 0:
        return torch.ones_like(sum_squares, dtype=torch.float32)
    table, norm_scale = schedule(coefficients, steps)
    sum_squares = sum_squares.float().clamp_min(0)
    total = torch.sqrt(sum_squares.sum(-1, keepdim=True))
    ratio = (1.0 / (norm_scale * total + eps)).expand_as(sum_squares)
    return _polynomials(torch.sqrt(sum_squares) * ratio, ratio, table)
