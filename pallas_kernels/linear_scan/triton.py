"""Diagonal linear scan as a Pallas Triton kernel that streams time in blocks.

Each program owns one batch row and ``block_channels`` contiguous channels and walks time once,
keeping the float32 carry in registers. Time is taken ``block_time`` steps at a time: all rows of a
block are loaded first (``2 * block_time`` independent coalesced row loads in flight per program),
then the carry runs through them and the results are stored. The recurrence itself is one FMA per
element, so the kernel is bound by how many bytes are in flight, not by the serial chain: with
``B * D`` channels split into programs of 32 channels, every SM holds several programs, each with
``block_time`` rows of two arrays outstanding. Each of ``a``, ``b``, ``h`` crosses HBM exactly once,
which is what lets it approach copy bandwidth, where ``lax.associative_scan`` reads and writes its
tree levels several times (H200 anchor: associative_scan 1.07 TB/s effective, copy 2.9 TB/s; the
target here is >= 2 TB/s). Not yet timed on a GPU; compiled offline for sm_90
(``benchmarks/triton_resources.py``) the kernels use 108 (forward) and 142 (backward) registers
per thread at float32, no spills, no shared memory.

Forward:   h_t = a_t h_{t-1} + b_t                      (carry h)
Backward:  g_t = a_{t+1} g_{t+1} + dh_t,  db_t = g_t,  da_t = g_t h_{t-1},  dinitial = a_0 g_0
           (carry g and a_{t+1}; the same streaming loop run in the opposite direction)

``reverse=True`` swaps the roles of t-1 and t+1 everywhere. Shapes: ``a, b, h: [B, T, D]``,
``initial: [B, D]`` float32; ``D`` must be a multiple of ``block_channels`` (the wrapper pads).
Offsets are int32, so an array must have fewer than 2**31 elements.
Time needs no padding: the tail ``T mod block_time`` is unrolled statically.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _common

BLOCK_CHANNELS = 32
BLOCK_TIME = 32
# Interpret mode (CPU) unrolls fewer rows per block: same loop structure, far less compile time.
INTERPRET_BLOCK_TIME = 4


def _block_time(block_time: int | None) -> int:
    if block_time is not None:
        return block_time
    return INTERPRET_BLOCK_TIME if _common.interpret_mode() else BLOCK_TIME


def _stream_time(process_block, carry, num_steps: int, block_time: int, reverse: bool):
    """Call ``process_block(times, carry)`` over all time steps, ``block_time`` at a time.

    ``times`` lists the step indices of one block in scan order (descending when ``reverse``);
    full blocks run in a ``fori_loop``, the ragged tail is one more statically unrolled block.
    """
    num_blocks, tail = divmod(num_steps, block_time)
    offsets = range(block_time - 1, -1, -1) if reverse else range(block_time)
    tail_times = [num_blocks * block_time + i for i in range(tail)]

    def full_block(j, carry):
        block = num_blocks - 1 - j if reverse else j
        return process_block([block * block_time + i for i in offsets], carry)

    if reverse and tail:
        carry = process_block(tail_times[::-1], carry)
    carry = jax.lax.fori_loop(0, num_blocks, full_block, carry)
    if not reverse and tail:
        carry = process_block(tail_times, carry)
    return carry


def _forward_kernel(a_ref, b_ref, initial_ref, h_ref, *, block_channels, block_time, reverse):
    batch = pl.program_id(0)
    channels = pl.ds(pl.program_id(1) * block_channels, block_channels)

    def process_block(times, h):
        a_rows = [a_ref[batch, t, channels].astype(jnp.float32) for t in times]
        b_rows = [b_ref[batch, t, channels].astype(jnp.float32) for t in times]
        for t, a_t, b_t in zip(times, a_rows, b_rows):
            h = a_t * h + b_t
            h_ref[batch, t, channels] = h.astype(h_ref.dtype)
        return h

    initial = initial_ref[batch, channels]
    _stream_time(process_block, initial, h_ref.shape[1], block_time, reverse)


def _backward_kernel(
    a_ref, h_ref, initial_ref, dh_ref, da_ref, db_ref, dinitial_ref, *, block_channels, block_time, reverse
):
    batch = pl.program_id(0)
    channels = pl.ds(pl.program_id(1) * block_channels, block_channels)
    num_steps = a_ref.shape[1]
    initial = initial_ref[batch, channels]
    # h_{t-1} (h_{t+1} when reverse); the step that has none reads the initial state instead.
    edge = num_steps - 1 if reverse else 0

    def previous_state(t):
        row = jnp.clip(t + 1 if reverse else t - 1, 0, num_steps - 1)
        return jnp.where(t == edge, initial, h_ref[batch, row, channels].astype(jnp.float32))

    def process_block(times, carry):
        a_rows = [a_ref[batch, t, channels].astype(jnp.float32) for t in times]
        dh_rows = [dh_ref[batch, t, channels].astype(jnp.float32) for t in times]
        h_rows = [previous_state(t) for t in times]
        g, a_carry = carry
        for t, a_t, dh_t, h_previous in zip(times, a_rows, dh_rows, h_rows):
            g = a_carry * g + dh_t
            db_ref[batch, t, channels] = g.astype(db_ref.dtype)
            da_ref[batch, t, channels] = (g * h_previous).astype(da_ref.dtype)
            a_carry = a_t
        return g, a_carry

    zeros = jnp.zeros_like(initial)
    g, a_first = _stream_time(process_block, (zeros, zeros), num_steps, block_time, not reverse)
    dinitial_ref[batch, channels] = a_first * g


def _channel_block(num_channels: int, block_channels: int) -> int:
    """Largest power of two <= block_channels that divides the (padded) channel count."""
    block = block_channels
    while block > 1 and num_channels % block:
        block //= 2
    return block


def _pad_channels(x: jax.Array, block: int, value: float) -> jax.Array:
    pad = -x.shape[-1] % block
    if not pad:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], constant_values=value)


def _launch_shape(num_channels: int, block_channels: int) -> tuple[int, int]:
    """(channel block, padded channel count): pad only where no block of >= 16 channels divides D."""
    block = _channel_block(num_channels, block_channels)
    if block < min(16, block_channels) and num_channels > block:
        block = min(block_channels, 16)
    return block, num_channels + (-num_channels % block)


def _call(kernel, inputs, out_shapes, num_batch, num_channels, block, block_time, reverse):
    block_time = _block_time(block_time)
    return pl.pallas_call(
        functools.partial(kernel, block_channels=block, block_time=block_time, reverse=reverse),
        grid=(num_batch, num_channels // block),
        out_shape=out_shapes,
        interpret=_common.interpret_mode(),
        compiler_params=pl_triton.CompilerParams(num_warps=max(1, block // 32), num_stages=1),
        name="linear_scan",
    )(*inputs)


def _check_int32_addressable(x) -> None:
    """Triton offsets are int32: refuse arrays the kernel could not address."""
    if x.size >= 2**31:
        raise ValueError(f"a of shape {tuple(x.shape)} has >= 2**31 elements; split the batch")


def scan_forward(a, b, initial, reverse: bool, *, block_channels=BLOCK_CHANNELS, block_time=None):
    """``h`` in the result dtype of ``(a, b)``; ``initial`` is float32 ``[B, D]``."""
    _check_int32_addressable(a)
    num_batch, _, num_channels = a.shape
    block, padded = _launch_shape(num_channels, block_channels)
    inputs = (_pad_channels(a, block, 1.0), _pad_channels(b, block, 0.0), _pad_channels(initial, block, 0.0))
    out = jax.ShapeDtypeStruct(inputs[0].shape[:2] + (padded,), jnp.result_type(a, b))
    h = _call(_forward_kernel, inputs, out, num_batch, padded, block, block_time, reverse)
    return h[..., :num_channels]


def scan_backward(
    a, h, initial, dh, reverse: bool, *, db_dtype, block_channels=BLOCK_CHANNELS, block_time=None
):
    """``(da, db, dinitial)`` from the forward output ``h``: ``da`` in ``a.dtype``, ``db`` in
    ``db_dtype``, ``dinitial`` in float32."""
    num_batch, num_steps, num_channels = a.shape
    block, padded = _launch_shape(num_channels, block_channels)
    inputs = tuple(_pad_channels(x, block, 0.0) for x in (a, h, initial, dh))
    out_shapes = (
        jax.ShapeDtypeStruct((num_batch, num_steps, padded), a.dtype),
        jax.ShapeDtypeStruct((num_batch, num_steps, padded), db_dtype),
        jax.ShapeDtypeStruct((num_batch, padded), jnp.float32),
    )
    da, db, dinitial = _call(_backward_kernel, inputs, out_shapes, num_batch, padded, block, block_time, reverse)
    return da[..., :num_channels], db[..., :num_channels], dinitial[..., :num_channels]
