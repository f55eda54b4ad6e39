"""Newton-Schulz conditioning of low-rank injections through their factors (closed forms).

``NS_k`` is the iteration of ``pallas_kernels.newton_schulz`` with ``k`` steps::

    X_0 = U / (norm_scale ||U||_F + eps),   X_{j+1} = a_j X_j + b_j (X_j X_j^T) X_j + c_j (X_j X_j^T)^2 X_j

It acts on each singular value s of X_0 by the odd polynomials p_j(s) = a_j s + b_j s^3 + c_j s^5 and
keeps the singular vectors. MuonSSM defines ``NS_0(U) = U`` (no conditioning, so k = 0 recovers
the backbone); for k >= 1 the results below equal ``newton_schulz(U, steps=k)``.

**Rank 1.** ``U = u v^T`` has one singular value ``||U||_F = ||u|| ||v||``, so
``NS_k(U) = s_k U / ||U||_F`` with ``s_0 = ||U||_F / (norm_scale ||U||_F + eps)`` and
``s_{j+1} = p_j(s_j)``. ``rank_one_scale`` returns the scalar ``r_k = s_k / ||U||_F``, computed as
``r_0 = 1 / (norm_scale ||U||_F + eps)`` and ``r_{j+1} = r_j (a_j + b_j s_j^2 + c_j s_j^4)``: no
division by ``||U||_F``, finite (with finite gradients) at U = 0.

**Block-diagonal rank 1.** ``U = diag(U_1, ..., U_H)`` with rank-1 blocks of Frobenius norms
``sigma_h``: ``X_0`` divides every block by the one norm ``||U||_F = sqrt(sum_h sigma_h^2)``, and
``X X^T X`` stays block-diagonal, so ``NS_k(U) = diag(r_{k,h} U_h)`` where each block's singular value
``s_{0,h} = sigma_h / (norm_scale ||U||_F + eps)`` goes through the polynomials.
``block_rank_one_scale`` returns the ``r_{k,h}``; with one block it is ``rank_one_scale``.

**Rank r.** ``U = L R^T`` with ``L [M, r]``, ``R [N, r]``: every iterate stays ``X_j = L C_j R^T``
with an ``[r, r]`` core. With ``G_L = L^T L``, ``G_R = R^T R`` and ``P_j = C_j G_R C_j^T G_L``::

    C_0 = I / (norm_scale sqrt(tr(G_L G_R)) + eps),   C_{j+1} = (a_j I + b_j P_j + c_j P_j^2) C_j

since ``X X^T X = L C G_R C^T G_L C R^T``. Cost O((M + N) r^2 + k r^3) instead of O(k M N min(M, N)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.newton_schulz.coefficients import resolve_coefficients

HIGHEST = jax.lax.Precision.HIGHEST


def _safe_sqrt(x: jax.Array) -> jax.Array:
    """``sqrt(x)`` for ``x >= 0`` with gradient 0 (not inf) at 0."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def rank_one_scale(sum_squares: jax.Array, *, steps: int, coefficients="muon", eps: float = 1e-7) -> jax.Array:
    """``r`` with ``NS_k(U) = r U`` for rank-1 ``U`` of squared Frobenius norm ``sum_squares`` (any shape).

    ``steps = 0`` gives 1 (``NS_0`` is the identity). Needs ``eps > 0`` (U = 0 then gives ``1 / eps``
    times the zero matrix).
    """
    if steps == 0:
        return jnp.ones_like(sum_squares, jnp.float32)
    if not eps > 0:
        raise ValueError(f"eps must be > 0 for the rank-1 closed form, got {eps!r}")
    schedule, norm_scale = resolve_coefficients(coefficients, steps)
    norm = _safe_sqrt(sum_squares.astype(jnp.float32))
    ratio = 1.0 / (norm_scale * norm + eps)
    singular = norm * ratio
    for a, b, c in schedule:
        squared = singular * singular
        multiplier = a + squared * (b + c * squared)
        singular, ratio = singular * multiplier, ratio * multiplier
    return ratio


def block_rank_one_scale(sum_squares: jax.Array, *, steps: int, coefficients="muon", eps: float = 1e-7,
                         axis: int = -1) -> jax.Array:
    """``r_h`` with ``NS_k(diag(U_h)) = diag(r_h U_h)``; ``sum_squares`` holds ``||U_h||_F^2`` along ``axis``.

    The blocks along ``axis`` form one block-diagonal matrix (module docstring); ``steps = 0`` gives 1.
    """
    if steps == 0:
        return jnp.ones_like(sum_squares, jnp.float32)
    if not eps > 0:
        raise ValueError(f"eps must be > 0 for the rank-1 closed form, got {eps!r}")
    schedule, norm_scale = resolve_coefficients(coefficients, steps)
    sum_squares = sum_squares.astype(jnp.float32)
    total = _safe_sqrt(jnp.sum(sum_squares, axis=axis, keepdims=True))
    ratio = jnp.broadcast_to(1.0 / (norm_scale * total + eps), sum_squares.shape)
    singular = _safe_sqrt(sum_squares) * ratio
    for a, b, c in schedule:
        squared = singular * singular
        multiplier = a + squared * (b + c * squared)
        singular, ratio = singular * multiplier, ratio * multiplier
    return ratio


def low_rank_newton_schulz(left: jax.Array, right: jax.Array, *, steps: int, coefficients="muon",
                           eps: float = 1e-7) -> jax.Array:
    """Core ``C [..., r, r]`` with ``NS_k(left @ right^T) = left @ C @ right^T``.

    ``left: [..., M, r]``, ``right: [..., N, r]``; ``steps = 0`` gives the identity (``NS_0(U) = U``).
    """
    if left.ndim < 2 or right.ndim < 2 or left.shape[-1] != right.shape[-1]:
        raise ValueError(f"left [..., M, r] and right [..., N, r] must share the rank r, got shapes "
                         f"{tuple(left.shape)} and {tuple(right.shape)}")
    rank = left.shape[-1]
    left, right = left.astype(jnp.float32), right.astype(jnp.float32)
    gram_left = jnp.einsum("...mi,...mj->...ij", left, left, precision=HIGHEST)
    gram_right = jnp.einsum("...ni,...nj->...ij", right, right, precision=HIGHEST)
    eye = jnp.broadcast_to(jnp.eye(rank, dtype=jnp.float32), gram_left.shape)
    if steps == 0:
        return eye
    schedule, norm_scale = resolve_coefficients(coefficients, steps)
    norm = _safe_sqrt(jnp.sum(gram_left * gram_right, axis=(-2, -1)))  # tr(G_L G_R), both symmetric
    core = eye / (norm_scale * norm + eps)[..., None, None]
    matmul = lambda x, y: jnp.matmul(x, y, precision=HIGHEST)  # noqa: E731
    for a, b, c in schedule:
        product = matmul(matmul(core, gram_right), matmul(jnp.swapaxes(core, -1, -2), gram_left))
        core = matmul(a * eye + b * product + c * matmul(product, product), core)
    return core
