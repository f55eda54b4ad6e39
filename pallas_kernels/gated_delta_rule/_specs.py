"""Block specs and launch settings shared by the forward and backward Pallas calls.

Sequences stay in the caller's ``[B, T, H, D]`` layout: a program owns one (batch, head) pair,
``bh = b * H + h``, and indexes chunks of rows itself (``ref[pl.ds(c * C, C), :]``, a strided
load of ``C`` rows), so no transpose of q/k/v is ever materialised. Gates and the cumulative log
decay are ``[B, H, T]`` float32; states are ``[B, H, rows, V]``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Static settings of one call (hashable: it is a ``custom_vjp`` non-differentiable argument).

    ``key_block``/``value_block``: column blocks of K and V a program holds at once (powers of two,
    >= 16). ``interpret``: run the kernels in the Pallas interpreter (CPU).
    """

    scale: float
    chunk_size: int
    key_block: int
    value_block: int
    interpret: bool


def sequence_spec(length, width, heads, bh_axis, column_axis=None):
    """``[B, T, H, D]`` array: all ``T`` rows of one (batch, head), columns ``width`` wide."""

    def index_map(*grid):
        bh = grid[bh_axis]
        column = 0 if column_axis is None else grid[column_axis]
        return (bh // heads, 0, bh % heads, column)

    return pl.BlockSpec((None, length, None, width), index_map)


def gate_spec(length, heads, bh_axis, lead_axis=None):
    """``[B, H, T]`` gate (or ``[L, B, H, T]`` with the lead index from grid axis ``lead_axis``)."""
    if lead_axis is None:
        return pl.BlockSpec((None, None, length), lambda *g: (g[bh_axis] // heads, g[bh_axis] % heads, 0))
    return pl.BlockSpec(
        (None, None, None, length),
        lambda *g: (g[lead_axis], g[bh_axis] // heads, g[bh_axis] % heads, 0),
    )


def state_spec(rows, width, heads, bh_axis, column_axis=None):
    """``[B, H, rows, V]`` state(s) of one (batch, head), columns ``width`` wide."""

    def index_map(*grid):
        bh = grid[bh_axis]
        column = 0 if column_axis is None else grid[column_axis]
        return (bh // heads, bh % heads, 0, column)

    return pl.BlockSpec((None, None, rows, width), index_map)


# (num_warps, num_stages) per kernel for 2-byte operands. Chosen offline from what ptxas reports
# for sm_90a at B8 T4096 H16 K=V=128 bf16, chunk 64 (no register spills); to be re-tuned on the
# GPU. float32 operands take one stage: two would need ~290 KiB of shared memory in the sweeps.
LAUNCH = {
    "prepare": (4, 1),
    "forward_sweep": (4, 2),
    "backward_sweep": (4, 2),
    "chunk_gradients": (8, 1),
    "ut_backward": (8, 1),
}


def launch_settings(name, operand_dtype):
    """``(num_warps, num_stages)`` of kernel ``name`` for matmul operands of ``operand_dtype``."""
    num_warps, num_stages = LAUNCH[name]
    return num_warps, (num_stages if jnp.dtype(operand_dtype).itemsize <= 2 else 1)


def call(kernel, *, grid, in_specs, out_specs, out_shape, config, name, operand_dtype):
    """``pl.pallas_call`` named ``gated_delta_rule_<name>``, with the Triton compiler parameters
    of ``launch_settings`` and the configured interpret mode."""
    num_warps, num_stages = launch_settings(name, operand_dtype)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=config.interpret,
        compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        name=f"gated_delta_rule_{name}",
    )


def shape_of(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)
