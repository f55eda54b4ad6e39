"""Fused Newton–Schulz on TPU (Pallas, Mosaic backend): one kernel runs every step.

Grid: one program per matrix of the batch (a "parallel" axis, split across TensorCores). Each
program holds its whole matrix X [BM, BN] in VMEM, on the wide orientation (the wrapper transposes
tall matrices, M > N, in XLA), zero-padded so both sides are multiples of 128 (the MXU tile and the
lane width: every matmul operand and the Gram matrix [BM, BM] are whole (8, 128) tiles):

    X_0 = x / (norm_scale ||x||_F + eps)              (0 when x = 0)
    A = X X^T   [BM, BM]        X <- a X + (b A + c A A) X        for each (a, b, c)

``X X^T`` contracts the last axes of both operands (the MXU's transposed-RHS form); the other two
products are plain. Zero padding stays zero (see triton.py), and the wrapper slices it away.
Precision follows ``xla.operand_policy``: fp32 inputs use fp32 matmuls (Precision.HIGHEST), bf16 /
fp16 inputs feed the MXU in the input dtype with fp32 accumulation; X and A are carried in fp32.

VMEM: X, A, A A and the polynomial are fp32 [<= 512, <= 512] blocks (1 MiB each at 512), plus the
double-buffered input and output blocks: at most ~8 MiB, inside v5e's 16 MiB default scoped VMEM.
Larger matrices go through ``xla.py``, which is at the matmul ceiling there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _common
from pallas_kernels.newton_schulz.xla import operand_policy

TILE = 128
MAX_BLOCK_SIDE = 512


def block_side(size: int) -> int:
    """``size`` rounded up to a multiple of 128."""
    return -(-size // TILE) * TILE


def fits_on_chip(rows: int, cols: int) -> bool:
    """Whether a rows x cols matrix runs in the fused kernel (both padded sides <= 512)."""
    return max(block_side(rows), block_side(cols)) <= MAX_BLOCK_SIDE


def _matmul(p, q, contract_p: int, contract_q: int, operand_dtype, precision):
    return jax.lax.dot_general(p.astype(operand_dtype), q.astype(operand_dtype),
                               (((contract_p,), (contract_q,)), ((), ())), precision=precision,
                               preferred_element_type=jnp.float32)


def _normalize(x, norm_scale: float, eps: float):
    """x / (norm_scale ||x||_F + eps), 0 for a zero block; x: [BM, BN] fp32, the sum kept 2-D ([1, 1])."""
    sum_squares = jnp.sum(jnp.sum(x * x, axis=1, keepdims=True), axis=0, keepdims=True)
    inverse = jnp.where(sum_squares > 0, 1.0 / (norm_scale * jnp.sqrt(sum_squares) + eps), 0.0)
    return x * inverse


def _kernel(x_ref, out_ref, *, coefficients, norm_scale, eps):
    operand_dtype, precision = operand_policy(x_ref.dtype)
    matmul = functools.partial(_matmul, operand_dtype=operand_dtype, precision=precision)
    matrix = _normalize(x_ref[...].astype(jnp.float32), norm_scale, eps)
    for a, b, c in coefficients:
        gram = matmul(matrix, matrix, 1, 1)  # X X^T  [BM, BM]
        poly = b * gram + c * matmul(gram, gram, 1, 0)
        matrix = a * matrix + matmul(poly, matrix, 1, 0)
    out_ref[...] = matrix.astype(out_ref.dtype)


def fused_call(padded: jax.Array, *, coefficients, norm_scale: float, eps: float,
               interpret: bool | None = None) -> jax.Array:
    """Run the fused kernel on a zero-padded wide stack ``padded`` [B, BM, BN] (sides multiples of 128).

    ``interpret`` defaults to ``_common.interpret_mode()`` (True on CPU).
    """
    batch, block_rows, block_cols = padded.shape
    spec = pl.BlockSpec((None, block_rows, block_cols), lambda i: (i, 0, 0))
    kernel = functools.partial(_kernel, coefficients=tuple(coefficients), norm_scale=norm_scale, eps=eps)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(padded.shape, padded.dtype),
        grid=(batch,),
        in_specs=[spec],
        out_specs=spec,
        interpret=_common.interpret_mode() if interpret is None else interpret,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        name="newton_schulz_fused_tpu",
    )(padded)


def newton_schulz(x: jax.Array, coefficients, norm_scale: float, eps: float) -> jax.Array:
    """x [..., M, N] with both sides padded to <= 512 -> [..., M, N] through one fused kernel launch."""
    rows, cols = x.shape[-2:]
    stack = x.reshape((-1, rows, cols))
    tall = rows > cols
    if tall:
        stack = jnp.swapaxes(stack, 1, 2)
    wide_rows, wide_cols = stack.shape[1:]
    block_rows, block_cols = block_side(wide_rows), block_side(wide_cols)
    if (block_rows, block_cols) != (wide_rows, wide_cols):
        stack = jnp.pad(stack, ((0, 0), (0, block_rows - wide_rows), (0, block_cols - wide_cols)))
    out = fused_call(stack, coefficients=coefficients, norm_scale=norm_scale, eps=eps)[:, :wide_rows, :wide_cols]
    if tall:
        out = jnp.swapaxes(out, 1, 2)
    return out.reshape(x.shape)
