"""Fused Newton–Schulz on GPU (Pallas, Triton backend): one kernel runs every step.

Grid: one program per matrix of the batch. Each program loads its whole matrix x [M, N], padded
with zeros to a power-of-two block [BM, BN] (each side >= 16, the Triton matmul minimum), and keeps
it on chip for all steps:

    X_0 = x / (norm_scale ||x||_F + eps)              (0 when x = 0)
    wide (M <= N):  A = X X^T    [BM, BM]   X <- a X + (b A + c A A) X
    tall (M > N):   A = X^T X    [BN, BN]   X <- a X + X (b A + c A A)

The tall form is the transposed iteration written without transposing X: (X^T)' = a X^T + P X^T
with P = p(X^T X) symmetric, so X' = a X + X P. Only X is written back, once.

Padding stays exactly zero: a zero row (column) of X gives a zero row and column of A, hence of
b A + c A A, and every new entry in a padded row or column is a sum of products that each have a
zero factor, which is exactly 0 in floating point for finite data. The public wrapper slices the
padding away.

Precision follows ``xla.operand_policy``: fp32 inputs use IEEE fp32 matmuls; bf16 / fp16 inputs
feed the tensor cores in the input dtype with fp32 accumulation, carrying X and A in fp32.

Size: a block side of at most ``MAX_BLOCK_SIDE`` (256) is held on chip (registers; with 16 warps
at 256, some spills); larger matrices go through ``xla.py``, which is at the matmul ceiling there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import _common
from pallas_kernels.newton_schulz.xla import operand_policy

MAX_BLOCK_SIDE = 256
MIN_BLOCK_SIDE = 16


def block_side(size: int) -> int:
    """The smallest power of two >= max(size, 16)."""
    return max(MIN_BLOCK_SIDE, 1 << (size - 1).bit_length())


def fits_on_chip(rows: int, cols: int) -> bool:
    """Whether a rows x cols matrix runs in the fused kernel (both padded sides <= 256)."""
    return max(block_side(rows), block_side(cols)) <= MAX_BLOCK_SIDE


def num_warps(block_rows: int, block_cols: int) -> int:
    """4 warps up to 64 x 64 blocks, 8 up to 128, 16 beyond (more registers for A and A A)."""
    side = max(block_rows, block_cols)
    return 4 if side <= 64 else 8 if side <= 128 else 16


def _matmul(p, q, contract_p: int, contract_q: int, operand_dtype, precision):
    """p contracted with q over axis ``contract_p`` of p and ``contract_q`` of q, fp32 result."""
    return jax.lax.dot_general(
        p.astype(operand_dtype),
        q.astype(operand_dtype),
        (((contract_p,), (contract_q,)), ((), ())),
        precision=precision,
        preferred_element_type=jnp.float32,
    )


def _normalize(x, norm_scale: float, eps: float):
    """x / (norm_scale ||x||_F + eps), 0 for a zero block; x: [BM, BN] fp32."""
    sum_squares = jnp.sum(jnp.sum(x * x, axis=1), axis=0)
    inverse = jnp.where(sum_squares > 0, 1.0 / (norm_scale * jnp.sqrt(sum_squares) + eps), 0.0)
    return x * inverse


def _step(matrix, abc, tall: bool, operand_dtype, precision):
    """One quintic step on the fp32 block ``matrix`` [BM, BN]."""
    a, b, c = abc
    matmul = functools.partial(_matmul, operand_dtype=operand_dtype, precision=precision)
    if tall:
        gram = matmul(matrix, matrix, 0, 0)  # X^T X  [BN, BN]
        poly = b * gram + c * matmul(gram, gram, 1, 0)
        return a * matrix + matmul(matrix, poly, 1, 0)
    gram = matmul(matrix, matrix, 1, 1)  # X X^T  [BM, BM]
    poly = b * gram + c * matmul(gram, gram, 1, 0)
    return a * matrix + matmul(poly, matrix, 1, 0)


def _kernel(x_ref, out_ref, *, coefficients, norm_scale, eps, tall):
    operand_dtype, precision = operand_policy(x_ref.dtype)
    matrix = _normalize(x_ref[...].astype(jnp.float32), norm_scale, eps)
    for abc in coefficients:
        matrix = _step(matrix, abc, tall, operand_dtype, precision)
    out_ref[...] = matrix.astype(out_ref.dtype)


def fused_call(
    padded: jax.Array,
    *,
    coefficients,
    norm_scale: float,
    eps: float,
    tall: bool,
    interpret: bool | None = None,
) -> jax.Array:
    """Run the fused kernel on a zero-padded stack ``padded`` [B, BM, BN] (power-of-two sides).

    ``interpret`` defaults to ``_common.interpret_mode()`` (True on CPU).
    """
    batch, block_rows, block_cols = padded.shape
    spec = pl.BlockSpec((None, block_rows, block_cols), lambda i: (i, 0, 0))
    kernel = functools.partial(
        _kernel, coefficients=tuple(coefficients), norm_scale=norm_scale, eps=eps, tall=tall
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(padded.shape, padded.dtype),
        grid=(batch,),
        in_specs=[spec],
        out_specs=spec,
        interpret=_common.interpret_mode() if interpret is None else interpret,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps(block_rows, block_cols), num_stages=1),
        name="newton_schulz_fused",
    )(padded)


def newton_schulz(x: jax.Array, coefficients, norm_scale: float, eps: float) -> jax.Array:
    """x [..., M, N] with M, N <= 256 -> [..., M, N] through one fused kernel launch."""
    rows, cols = x.shape[-2:]
    block_rows, block_cols = block_side(rows), block_side(cols)
    stack = x.reshape((-1, rows, cols))
    if (block_rows, block_cols) != (rows, cols):
        stack = jnp.pad(stack, ((0, 0), (0, block_rows - rows), (0, block_cols - cols)))
    out = fused_call(stack, coefficients=coefficients, norm_scale=norm_scale, eps=eps, tall=rows > cols)
    return out[:, :rows, :cols].reshape(x.shape)
