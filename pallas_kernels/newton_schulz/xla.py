"""Newton–Schulz in batched pure JAX: the steps unrolled, every matrix of the batch at once.

Same iteration as ``reference.py`` (X_0 = x / (norm_scale ||x||_F + eps); A = X X^T;
X <- a X + (b A + c A A) X on the wide orientation), written as batched matmuls that XLA runs at
the matmul ceiling for large matrices. Precision policy, shared with the Pallas kernels and with
the backward below:

- fp32 input: matmuls in fp32 at ``Precision.HIGHEST`` (no TF32).
- bf16 / fp16 input: matmul operands rounded to the input dtype, products accumulated in fp32;
  X, A and the polynomial combination are carried in fp32 between matmuls.

Backward (``jax.custom_vjp`` of the iteration; the normalisation and the transpose are
differentiated by JAX). With ``B_t = b_t A_t + c_t A_t A_t`` (symmetric, as ``A_t`` is) and
``G`` the cotangent of ``X_{t+1} = a_t X_t + B_t X_t``, step t's pullback is

    dB = G X_t^T,   E = dB + dB^T,   D = b_t E + c_t (E A_t + (E A_t)^T)      (= dA + dA^T)
    dX_t = a_t G + B_t G + D X_t

four matmuls (``6 s^2 l + 2 s^3`` FLOPs on an ``[s, l]`` wide matrix, against ``8 s^2 l + 4 s^3`` for
JAX's autodiff of the forward, which transposes each of its three products into two), under the
same operand policy as the forward: a bf16 input runs its backward on bf16 operands with fp32
accumulation too. The forward keeps ``X_t, A_t, B_t`` of every step (as matmul operands, in the
operand dtype) for the backward. In fp32 the result equals autodiff of ``reference.py`` up to
rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.newton_schulz.reference import normalize


def operand_policy(dtype) -> tuple[jnp.dtype, jax.lax.Precision]:
    """(matmul operand dtype, precision) for inputs of ``dtype``: fp32 exact, half types native."""
    if jnp.dtype(dtype).itemsize < 4:
        return jnp.dtype(dtype), jax.lax.Precision.DEFAULT
    return jnp.dtype(jnp.float32), jax.lax.Precision.HIGHEST


def _matmul(p, q, dtype_name: str):
    """``p @ q`` over the last two axes on operands of the policy of ``dtype_name``, accumulated in fp32."""
    operand_dtype, precision = operand_policy(dtype_name)
    return jnp.matmul(p.astype(operand_dtype), q.astype(operand_dtype), precision=precision,
                      preferred_element_type=jnp.float32)


def _transpose(x):
    return jnp.swapaxes(x, -1, -2)


def _steps(matrix, coefficients, dtype_name: str):
    """The iteration on the wide, normalised fp32 ``matrix``; ``(X_k, [(X_t, A_t, B_t) for t < k])``."""
    operand_dtype, _ = operand_policy(dtype_name)
    saved = []
    for a, b, c in coefficients:
        gram = _matmul(matrix, _transpose(matrix), dtype_name)
        poly = b * gram + c * _matmul(gram, gram, dtype_name)
        saved.append(tuple(m.astype(operand_dtype) for m in (matrix, gram, poly)))
        matrix = a * matrix + _matmul(poly, matrix, dtype_name)
    return matrix, saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _iterate(matrix, coefficients, dtype_name: str):
    return _steps(matrix, coefficients, dtype_name)[0]


def _iterate_forward(matrix, coefficients, dtype_name):
    return _steps(matrix, coefficients, dtype_name)


def _iterate_backward(coefficients, dtype_name, saved, cotangent):
    """The pullback of every step, last to first (module docstring)."""
    grad = cotangent.astype(jnp.float32)
    for (a, b, c), (matrix, gram, poly) in zip(reversed(coefficients), reversed(saved)):
        grad_poly = _matmul(grad, _transpose(matrix), dtype_name)
        symmetric = grad_poly + _transpose(grad_poly)
        product = _matmul(symmetric, gram, dtype_name)
        grad_gram = b * symmetric + c * (product + _transpose(product))
        grad = a * grad + _matmul(poly, grad, dtype_name) + _matmul(grad_gram, matrix, dtype_name)
    return (grad,)


_iterate.defvjp(_iterate_forward, _iterate_backward)


def newton_schulz(x: jax.Array, coefficients, norm_scale: float, eps: float) -> jax.Array:
    """x [..., M, N] -> [..., M, N]; ``coefficients`` holds one static (a, b, c) triple per step."""
    transpose = x.shape[-2] > x.shape[-1]
    matrix = normalize(x.astype(jnp.float32), norm_scale, eps)
    if transpose:
        matrix = _transpose(matrix)
    coefficients = tuple(tuple(float(v) for v in row) for row in coefficients)
    if coefficients:
        matrix = _iterate(matrix, coefficients, jnp.dtype(x.dtype).name)
    if transpose:
        matrix = _transpose(matrix)
    return matrix.astype(x.dtype)
