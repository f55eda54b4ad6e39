"""Array math shared by the Pallas kernels: matmuls, decay masks, the unit-lower-triangular inverse.

Only operations the Pallas Triton lowering supports are used (2-D ``dot_general``, iota, where,
single-axis reductions, ``fori_loop``), so a Mosaic GPU or TPU port can reuse these helpers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

DIAGONAL_BLOCK = 16  # rows of the diagonal blocks inverted by forward substitution
_F32 = jnp.float32


def dot(a, b, dot_dtype, *, transpose_a=False, transpose_b=False, exact=False):
    """``a @ b`` (optionally transposing either side) on ``dot_dtype`` operands, float32 result.

    On GPU the operands go to the tensor cores: bf16/f16 as they are, float32 as TF32 (10-bit
    mantissa, as flash-linear-attention does), always accumulating in float32. ``exact=True``
    asks for IEEE float32 (FMA units; used only for the small 16x16 blocks of ``T``). In the
    CPU interpreter every float32 product is exact float32.
    """
    precision = jax.lax.Precision.HIGHEST if exact else None
    contract_a = 0 if transpose_a else 1
    contract_b = 1 if transpose_b else 0
    return jax.lax.dot_general(
        a.astype(dot_dtype),
        b.astype(dot_dtype),
        (((contract_a,), (contract_b,)), ((), ())),
        precision=precision,
        preferred_element_type=_F32,
    )


def decay_matrix(gamma_rows, gamma_cols, mask: str):
    """``exp(gamma_i - gamma_j)``; ``mask`` is ``"strict"`` (j < i), ``"causal"`` (j <= i) or
    ``"none"``. Masked entries get ``-inf`` before ``exp``: exactly 0, never ``inf * 0``."""
    diff = gamma_rows[:, None] - gamma_cols[None, :]
    if mask == "none":
        return jnp.exp(diff)
    shape = diff.shape
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    keep = rows > cols if mask == "strict" else rows >= cols
    return jnp.exp(jnp.where(keep, diff, -jnp.inf))


def row_sum(x):
    return jnp.sum(x, axis=1)


def total_sum(x):
    return jnp.sum(jnp.sum(x, axis=1), axis=0)


def invert_unit_lower(strict_blocks):
    """``(I + a)^{-1}`` for each strictly-lower ``[16, 16]`` float32 block, by forward substitution.

    Row ``r`` of the inverse is ``e_r - sum_{j < r} a[r, j] * inverse[j, :]``; rows are filled in
    order, each from rows already final, all blocks in one loop.
    """
    size = DIAGONAL_BLOCK
    rows = jax.lax.broadcasted_iota(jnp.int32, (size, size), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (size, size), 1)
    eye = jnp.where(rows == cols, 1.0, 0.0).astype(_F32)

    def substitute_row(r, inverses):
        updated = []
        for a, inverse in zip(strict_blocks, inverses):
            a_row = jnp.sum(jnp.where(rows == r, a, 0.0), axis=0)  # a[r, :]
            combination = jnp.sum(a_row[:, None] * inverse, axis=0)  # sum_j a[r, j] inverse[j, :]
            updated.append(inverse - jnp.where(rows == r, combination[None, :], 0.0))
        return tuple(updated)

    initial = tuple(eye for _ in strict_blocks)
    return list(jax.lax.fori_loop(1, size, substitute_row, initial))


def ut_inverse_blocks(k_blocks, beta_blocks, gamma_blocks, dot_dtype):
    """Blocks ``T[i][j]`` (``j <= i``, ``[16, 16]`` float32) of ``T = (I + A)^{-1}`` for one chunk,
    ``A = strict_lower(diag(beta) K K^T o exp(gamma_i - gamma_j))``, from 16-row blocks of K.

    Diagonal blocks by forward substitution; below them block forward substitution,
    ``T_ij = -T_ii sum_{j <= m < i} A_im T_mj``.
    """
    count = len(k_blocks)
    a = {}
    for i in range(count):
        for j in range(i + 1):
            kk = dot(k_blocks[i], k_blocks[j], dot_dtype, transpose_b=True)
            decay = decay_matrix(gamma_blocks[i], gamma_blocks[j], "strict" if i == j else "none")
            a[i, j] = beta_blocks[i][:, None] * kk * decay
    diagonal = invert_unit_lower([a[i, i] for i in range(count)])
    inverse = {(i, i): diagonal[i] for i in range(count)}
    for i in range(1, count):
        for j in range(i):
            acc = sum(dot(a[i, m], inverse[m, j], _F32, exact=True) for m in range(j, i))
            inverse[i, j] = -dot(inverse[i, i], acc, _F32, exact=True)
    return inverse
