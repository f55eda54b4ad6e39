"""The Atlas memory's chunk sweep as one Pallas kernel for GPUs (Triton backend; the Pallas interpreter on CPU).

Grid ``(B, H)``: a program per (row, head) walks that row's chunks in order (a ``fori_loop``; Triton has no
sequential grid axis with scratch, which the Mosaic kernel of ``tpu.py`` uses), the memory ``M`` and the
momentum ``S`` (one ``[m, n]`` float32 matrix each per weight matrix) carried on chip from chunk to chunk.
Each chunk runs the token rule of the package docstring exactly as ``tpu.py`` does (the same
``_kernel_math``: the rank-1 gradient factors of the chunk's and the carried window's tokens at their
base; per token the masked window product ``G_t = L^T diag(w_t) R``, ``S_t``, ``NS_k(S_t)`` on the Gram
side, ``M_t`` and ``y_t``). Only ``y``, the chunk-start states of every ``every``-th chunk (an outer loop
over groups of ``every`` chunks writes them at each group's start) and the final states are written:
no per-token matrix leaves the chip. ``fused.py``'s chunk-recompute backward runs on those boundary
states, as for the Mosaic kernel.

Triton needs power-of-two sides for every block and at least 16 on each side of a matmul operand, so
``sweep`` pads, and the padding is inert:

- a chunk's ``b`` tokens to ``b' = pow2 >= 16`` rows, the carried window's ``c - 1`` tokens to ``h'`` rows:
  the extra rows have zero features, values and weight and a document of -2 (no token's), and the token
  loop runs over the ``b`` real tokens only;
- the features ``F``, the hidden width ``E`` and the values ``V`` to ``pow2 >= 16`` with zero columns (and
  ``M_0``, ``M``, ``S`` with zero rows and columns): a zero feature column gives zero rows of ``G``, so of
  ``S``, ``NS_k(S)`` (zero rows and columns stay zero through Newton-Schulz, the Frobenius norm is
  unchanged) and ``M``; ``E`` likewise through ``silu(0) = 0``; the value columns through the residual,
  given zero-padded (``_kernel_math``: Triton cannot slice a block held in registers), and the
  LayerNorm's means over the ``V`` true columns.

The reads ``y_t = M_t(phi(q_t))``: Triton's matmul takes at least 16 rows, so each token reads the whole
chunk block ``[b', F']`` through ``M_t`` and keeps row t (a masked select into the chunk's ``[b', V']``
outputs, stored once per chunk). That read is ``b'`` times one token's, about ``2 b' (F E + E V)`` FLOPs
per token against Newton-Schulz's ``k (2 m^2 n + m^3) `` per matrix: 5-10% of the token's work at
``configs/atlas.yaml``'s shapes.

Checked here: the interpreter's results against the ``reference`` oracle (``test_atlas_memory_fused``) and
the Pallas -> Triton IR lowering for an H200 on CPU (no GPU: ptxas and the launch are not exercised).
Launch: one stage, the warps of the fused Newton-Schulz kernel at the largest padded memory side
(``newton_schulz.triton.num_warps``: 4 up to 64, 8 up to 128); the carried matrices live in registers
(``fits`` keeps each padded side at most ``MAX_SIDE``), and at 128 they spill: to be tuned with
``benchmarks/gpu_suite.py``'s ``atlas_memory`` section on the GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels.atlas_memory import _kernel_math as math
from pallas_kernels.atlas_memory._kernel_math import ALPHA, DOCUMENT, ETA, FRESH, START, THETA, WEIGHT
from pallas_kernels.atlas_memory.inputs import AtlasSettings
from pallas_kernels.atlas_memory.memory import MemoryLayout, pack, unpack
from pallas_kernels.newton_schulz.triton import num_warps

_F32 = jnp.float32
GATE_COLUMNS = 8  # the seven per-token columns above, padded to a power of two
PADDING_DOCUMENT = -2.0  # of the padded rows: no token's document (tokens >= 0, an empty window entry -1)
MAX_SIDE = 128  # the largest padded side of a memory matrix kept on chip (M, S, NS(S) and the Gram in registers)


def side(size: int) -> int:
    """The smallest power of two >= max(size, 16): Triton's block side for ``size``."""
    return max(16, 1 << (size - 1).bit_length())


def fits(layout: MemoryLayout) -> bool:
    """Whether every padded side of the memory's matrices is at most ``MAX_SIDE``."""
    return all(max(side(m), side(n)) <= MAX_SIDE for m, n in layout.shapes)


def padded_layout(layout: MemoryLayout) -> MemoryLayout:
    """The layout at Triton's block sides (features, values and hidden width padded)."""
    return MemoryLayout(side(layout.feature_dim), side(layout.value_dim),
                        side(layout.hidden_dim) if layout.deep else 0, layout.norm)


def _kernel(*refs, settings: AtlasSettings, size: int, block: int, history: int, history_block: int,
            has_gain: bool, every: int, num_groups: int):
    layout = settings.layout
    padded = padded_layout(layout)
    count = len(layout.shapes)
    sides = [(side(m), side(n)) for m, n in layout.shapes]
    refs = list(refs)
    take = lambda k: [refs.pop(0) for _ in range(k)]  # noqa: E731
    keys_ref, values_ref, queries_ref, key_residual_ref, query_residual_ref, gates_ref = take(6)
    carried_refs = take(4) if history else None
    initial_refs, memory_in_refs, momentum_in_refs = take(count), take(count), take(count)
    gain = refs.pop(0)[...] if has_gain else None
    y_ref = refs.pop(0)
    memory_out_refs, momentum_out_refs, final_memory_refs, final_momentum_refs = (take(count) for _ in range(4))
    value_count = layout.value_dim
    initial = tuple(r[...] for r in initial_refs)
    positions = jax.lax.broadcasted_iota(jnp.int32, (block, 1), 0)
    carried_positions = jax.lax.broadcasted_iota(jnp.int32, (history_block, 1), 0) - history

    def chunk_step(chunk, state):
        memory, momentum = state
        rows = pl.ds(chunk * block, block)
        column = lambda index: gates_ref[rows, pl.ds(index, 1)]  # noqa: E731  [b', 1]
        chunk_factors = math.base_factors(memory, initial, keys_ref[rows, :], values_ref[rows, :], column(FRESH),
                                          column(WEIGHT), settings, gain, key_residual_ref[rows, :], value_count)
        chunk_terms = (chunk_factors, column(DOCUMENT), positions)
        carried = None
        if history:
            span = pl.ds(chunk * history_block, history_block)
            keys, values, residual = (r[span, :] for r in carried_refs[:3])
            carried_factors = math.clipped_factors(
                math.gradient_factors(memory, keys, values, padded, gain, residual, value_count),
                carried_refs[3][span, pl.ds(0, 1)], settings.grad_clip)
            carried = (carried_factors, carried_refs[3][span, pl.ds(1, 1)], carried_positions)
        queries, query_residual = queries_ref[rows, :], query_residual_ref[rows, :]
        columns = tuple(column(k) for k in (ALPHA, THETA, ETA, START))

        def token_step(t, state):
            memory, momentum, y = state
            memory, momentum = math.token_update((memory, momentum), t, chunk_terms, carried, columns, initial,
                                                 settings)
            read = math.memory_apply(memory, queries, padded, gain, query_residual, value_count)
            return memory, momentum, jnp.where(positions == t, read, y)

        y = jnp.zeros((block, padded.value_dim), _F32)
        memory, momentum, y = jax.lax.fori_loop(0, size, token_step, (memory, momentum, y))
        y_ref[rows, :] = y
        return memory, momentum

    def group_step(group, state):
        for out, value, (m, _) in zip(memory_out_refs + momentum_out_refs, state[0] + state[1], sides * 2):
            out[pl.ds(group * m, m), :] = value
        return jax.lax.fori_loop(group * every, (group + 1) * every, chunk_step, state)

    start = (tuple(r[...] for r in memory_in_refs), tuple(r[...] for r in momentum_in_refs))
    memory, momentum = jax.lax.fori_loop(0, num_groups, group_step, start)
    for out, value in zip(final_memory_refs + final_momentum_refs, memory + momentum):
        out[...] = value


def _pad_to(x, shape):
    """``x`` zero-padded at the end of each axis to ``shape``."""
    return jnp.pad(x, [(0, want - have) for have, want in zip(x.shape, shape)])


def _rows(x, rows: int, width: int, fill=0.0):
    """``[N, B, r, H, X]`` -> ``[B, H, N rows, width]``: each chunk's r rows padded to ``rows`` with ``fill``, the
    last axis with zeros to ``width``."""
    x = jnp.transpose(x, (1, 3, 0, 2, 4))  # [B, H, N, r, X]
    x = jnp.pad(x, [(0, 0)] * 4 + [(0, width - x.shape[-1])])
    x = jnp.pad(x, [(0, 0)] * 3 + [(0, rows - x.shape[3]), (0, 0)], constant_values=fill)
    return x.reshape(x.shape[0], x.shape[1], -1, width)


def sweep(carry, xs, windows, initial_memory, gain, settings: AtlasSettings, *, interpret: bool, every: int = 1):
    """``tpu.sweep``'s contract on a GPU: ``(y [N, B, b, H, V], the chunk-start memories and momenta of chunks 0,
    every, 2 every, ... [N / every, B, H, P], final memory and momentum [B, H, P])`` from the chunk scan's carry
    and inputs (``xla.chunked``'s layout) and the carried window of every chunk (``fused.windows``)."""
    layout, size, history = settings.layout, settings.chunk_size, settings.window - 1
    padded = padded_layout(layout)
    phi_k, values, phi_q, alpha, theta, eta, gamma, starts, document, _ = xs
    num_chunks, batch, _, heads, features = phi_k.shape
    if every < 1 or num_chunks % every:
        raise ValueError(f"every={every} boundary states must divide the {num_chunks} chunks")
    block, history_block = side(size), (side(history) if history else 0)
    value_dim, feature_dim = layout.value_dim, padded.feature_dim
    fresh = jnp.cumsum(starts.astype(jnp.int32), axis=2) > 0  # the token's document started in its chunk
    per_head = lambda x: jnp.broadcast_to(x[..., None], (*x.shape, heads)).astype(_F32)  # noqa: E731
    gates = jnp.stack([alpha, theta, eta, gamma, per_head(starts), per_head(document), per_head(fresh)], axis=-1)
    gates = _rows(gates, block, GATE_COLUMNS)  # [B, H, N b', 8]
    real_row = jnp.arange(gates.shape[2]) % block < size
    gates = gates.at[..., DOCUMENT].set(jnp.where(real_row, gates[..., DOCUMENT], PADDING_DOCUMENT))
    operands = [_rows(phi_k, block, feature_dim), _rows(values, block, padded.value_dim),
                _rows(phi_q, block, feature_dim), _rows(phi_k[..., :value_dim], block, padded.value_dim),
                _rows(phi_q[..., :value_dim], block, padded.value_dim), gates]
    if history:
        carried_keys, carried_values, carried_weights, carried_documents = windows  # [N, B, c - 1, H, ...]
        carried_gates = jnp.stack([carried_weights, per_head(carried_documents)], axis=-1)
        carried_gates = _rows(carried_gates, history_block, 2, PADDING_DOCUMENT)
        carried_gates = carried_gates.at[..., 0].set(jnp.where(carried_gates[..., 1] == PADDING_DOCUMENT, 0.0,
                                                               carried_gates[..., 0]))
        operands += [_rows(carried_keys, history_block, feature_dim),
                     _rows(carried_values, history_block, padded.value_dim),
                     _rows(carried_keys[..., :value_dim], history_block, padded.value_dim), carried_gates]
    rows = lambda length, width: pl.BlockSpec((None, None, length, width), lambda b, h: (b, h, 0, 0))  # noqa: E731
    in_specs = [rows(*x.shape[2:]) for x in operands]  # [B, H, rows, width]: a (row, head)'s whole sequence
    sides = [(side(m), side(n)) for m, n in layout.shapes]
    operands += [_pad_to(m0, (heads, *s)) for m0, s in zip(initial_memory, sides)]
    in_specs += [pl.BlockSpec((None, m, n), lambda b, h: (h, 0, 0)) for m, n in sides]
    for state in carry[:2]:
        operands += [_pad_to(x, (batch, heads, *s)) for x, s in zip(unpack(state, layout), sides)]
        in_specs += [pl.BlockSpec((None, None, m, n), lambda b, h: (b, h, 0, 0)) for m, n in sides]
    if gain is not None:
        operands.append(_pad_to(gain, (heads, padded.value_dim))[:, None, :])
        in_specs.append(pl.BlockSpec((None, 1, padded.value_dim), lambda b, h: (h, 0, 0)))
    num_groups = num_chunks // every
    boundary = [jax.ShapeDtypeStruct((batch, heads, num_groups * m, n), _F32) for m, n in sides]
    final = [jax.ShapeDtypeStruct((batch, heads, m, n), _F32) for m, n in sides]
    out_shape = [jax.ShapeDtypeStruct((batch, heads, num_chunks * block, padded.value_dim), _F32),
                 *boundary, *boundary, *final, *final]
    out_specs = [rows(num_chunks * block, padded.value_dim),
                 *(rows(num_groups * m, n) for m, n in sides * 2), *(rows(m, n) for m, n in sides * 2)]
    kernel = functools.partial(_kernel, settings=settings, size=size, block=block, history=history,
                               history_block=history_block, has_gain=gain is not None, every=every,
                               num_groups=num_groups)
    outputs = pl.pallas_call(
        kernel, grid=(batch, heads), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        compiler_params=pl_triton.CompilerParams(num_warps=max(num_warps(m, n) for m, n in sides), num_stages=1),
        interpret=interpret,
        name="atlas_memory_chunk_sweep_triton",
    )(*operands)
    count = len(layout.shapes)
    y, rest = outputs[0], outputs[1:]
    memories, momenta, final_memory, final_momentum = (rest[i * count:(i + 1) * count] for i in range(4))
    y = y.reshape(batch, heads, num_chunks, block, -1)[:, :, :, :size, :value_dim]
    y = jnp.transpose(y, (2, 0, 3, 1, 4))  # [N, B, b, H, V]

    def true_matrices(matrices, lead):  # padded [B, H, (G m'), n'] -> [B, H, (G,) m, n]
        out = []
        for x, (m, n), (m2, _) in zip(matrices, layout.shapes, sides):
            x = x.reshape(batch, heads, -1, m2, x.shape[-1]) if lead else x
            out.append(x[..., :m, :n])
        return out

    boundaries = tuple(jnp.moveaxis(pack(true_matrices(m, True), 3), 2, 0) for m in (memories, momenta))
    return y, boundaries, (pack(true_matrices(final_memory, False), 2), pack(true_matrices(final_momentum, False), 2))
