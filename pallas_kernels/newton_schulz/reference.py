"""Newton–Schulz oracle: one matrix at a time, a ``lax.scan`` over the steps, all in fp32.

For one matrix x [M, N] (transposed first when M > N, so that X X^T is the smaller Gram matrix):

    X_0 = x / (norm_scale * ||x||_F + eps)          (X_0 = 0 when x = 0)
    A_t = X_t X_t^T
    X_{t+1} = a_t X_t + (b_t A_t + c_t A_t A_t) X_t

and the result is transposed back. Every matmul runs at ``Precision.HIGHEST`` in fp32 whatever the
input dtype; the output is cast to the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normalize(x: jax.Array, norm_scale: float, eps: float) -> jax.Array:
    """x / (norm_scale ||x||_F + eps) over the last two axes; exactly 0 (with zero gradient) at x = 0."""
    sum_squares = jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True)
    nonzero = sum_squares > 0
    norm = jnp.sqrt(jnp.where(nonzero, sum_squares, 1.0))
    return jnp.where(nonzero, x / (norm_scale * norm + eps), 0.0)


def _one_matrix(x: jax.Array, coefficients: jax.Array, norm_scale: float, eps: float) -> jax.Array:
    transpose = x.shape[0] > x.shape[1]
    if transpose:
        x = x.T
    dot = lambda p, q: jnp.matmul(p, q, precision=jax.lax.Precision.HIGHEST)

    def step(matrix, abc):
        a, b, c = abc[0], abc[1], abc[2]
        gram = dot(matrix, matrix.T)
        return a * matrix + dot(b * gram + c * dot(gram, gram), matrix), None

    result, _ = jax.lax.scan(step, normalize(x, norm_scale, eps), coefficients)
    return result.T if transpose else result


def newton_schulz(x: jax.Array, coefficients, norm_scale: float, eps: float) -> jax.Array:
    """x [..., M, N] -> [..., M, N]; ``coefficients`` holds one (a, b, c) triple per step."""
    table = jnp.asarray(coefficients, jnp.float32).reshape(-1, 3)
    matrices = x.reshape((-1,) + x.shape[-2:]).astype(jnp.float32)
    result = jax.vmap(lambda m: _one_matrix(m, table, norm_scale, eps))(matrices)
    return result.reshape(x.shape).astype(x.dtype)
