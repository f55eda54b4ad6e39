"""Newton–Schulz in batched pure JAX: the steps unrolled, every matrix of the batch at once.

Same iteration as ``reference.py`` (X_0 = x / (norm_scale ||x||_F + eps); A = X X^T;
X <- a X + (b A + c A A) X on the wide orientation), written as batched matmuls that XLA runs at
the matmul ceiling for large matrices. Precision policy, shared with the Pallas kernel:

- fp32 input: matmuls in fp32 at ``Precision.HIGHEST`` (no TF32).
- bf16 / fp16 input: matmul operands rounded to the input dtype, products accumulated in fp32;
  X, A and the polynomial combination are carried in fp32 between matmuls.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.newton_schulz.reference import normalize


def operand_policy(dtype) -> tuple[jnp.dtype, jax.lax.Precision]:
    """(matmul operand dtype, precision) for inputs of ``dtype``: fp32 exact, half types native."""
    if jnp.dtype(dtype).itemsize < 4:
        return jnp.dtype(dtype), jax.lax.Precision.DEFAULT
    return jnp.dtype(jnp.float32), jax.lax.Precision.HIGHEST


def newton_schulz(x: jax.Array, coefficients, norm_scale: float, eps: float) -> jax.Array:
    """x [..., M, N] -> [..., M, N]; ``coefficients`` holds one static (a, b, c) triple per step."""
    operand_dtype, precision = operand_policy(x.dtype)

    def matmul(p, q):
        return jnp.matmul(
            p.astype(operand_dtype),
            q.astype(operand_dtype),
            precision=precision,
            preferred_element_type=jnp.float32,
        )

    transpose = x.shape[-2] > x.shape[-1]
    matrix = normalize(x.astype(jnp.float32), norm_scale, eps)
    if transpose:
        matrix = jnp.swapaxes(matrix, -1, -2)
    for a, b, c in coefficients:
        gram = matmul(matrix, jnp.swapaxes(matrix, -1, -2))
        matrix = a * matrix + matmul(b * gram + c * matmul(gram, gram), matrix)
    if transpose:
        matrix = jnp.swapaxes(matrix, -1, -2)
    return matrix.astype(x.dtype)
