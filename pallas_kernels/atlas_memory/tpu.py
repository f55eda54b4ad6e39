"""The Atlas memory's chunk sweep as one Pallas kernel (Mosaic; the Pallas interpreter on CPU).

Grid ``(B, H, N)``: a program per (row, head, chunk), the chunk axis "arbitrary" (sequential), the
memory ``M`` and the momentum ``S`` (one ``[m, n]`` float32 matrix each per weight matrix) in VMEM
scratch across the chunks of a (row, head). A chunk ``[s, e]`` of ``b`` tokens, with the ``h = c - 1``
tokens before it (the window's carried tokens, given as their own ``[h, F]`` block), runs the token
rule of the package docstring:

    1. the rank-1 gradient factors ``l_j, r_j`` of the chunk's and the carried tokens at their base
       (``M_s``, or ``M_0`` for a token whose document started in the chunk; a carried token's base is
       ``M_s``), each token's left scaled by its weight and clip: two ``[rows, F] x [F, n]`` passes;
    2. for t = s .. e (a ``fori_loop``): ``G_t = L^T diag(w_t) R`` with ``w_t`` the column of t's window
       (``t - c < j <= t``, t's document), one ``[m, span] x [span, n]`` product per weight matrix;
       ``S_t = theta_t S_{t-1} - eta_t G_t``, ``NS_k(S_t)`` (in VMEM, ``_kernel_math.newton_schulz``),
       ``M_t = alpha_t M_{t-1} + NS_k(S_t)`` (resets at a document start), ``y_t = M_t(phi(q_t))``.

Only ``y`` and the chunk-start states ``(M_s, S_s)`` of every ``every``-th chunk (and the last chunk's
end states) are written to HBM: no per-token matrix leaves the chip, and the boundary states the
backward does not keep are never written (their block stays in VMEM over the chunks it covers). The
boundary states are what ``fused.py``'s backward recomputes each chunk from. Only
``ns_granularity = "token"`` (the paper's rule) runs here.

Departures from the ``xla`` chunk, same rule: ``G_t`` is the masked product above, not the running
sum (one ``[m, span] x [span, n]`` product per token, on the MXU; the running sum would need rank-1
updates of ``[m, n]`` per token); ``NS_k`` works on the Gram side without transposing (``X^T X`` for a
tall matrix, as ``newton_schulz.triton``); both bases' factors are evaluated for every chunk (a
``where`` per token; the ``xla`` chunk skips ``M_0`` where no document starts, but a per-chunk
``lax.cond`` on a vector reduction is not what this kernel should ask of Mosaic). Float32 rounding
differs accordingly; the tests hold both to the oracle.

Checked here: the Mosaic lowering (Pallas, on CPU, no TPU needed: ``test_atlas_memory_fused``) and
the full compile by libtpu for a v5e chip ahead of time (F 96, V 32, E 64, chunk 16; F = V = E = 128,
chunk 64). Not run on a TPU. VMEM: the chunk's inputs (double-buffered ``[b, F]`` blocks), the
factors ``[c - 1 + b, m + n]`` at two bases, and per token ``G``, ``S``, ``M`` and the NS
intermediates of ``[m, n]`` matrices: a few MiB at ``m, n <= 128``, b 64. The GPU kernel (``triton.py``) is
the same rule on another driver: Triton has no sequential grid axis with scratch and needs power-of-two
blocks of at least 16 on a side, so it loops over a (row, head)'s chunks itself on zero-padded blocks.

Layouts: heads before time (``[B, H, T, F]``, blocks ``[b, F]``: ``b`` a multiple of 8 on TPU, or the
whole row; ``fits`` says so, and ``fused.py`` runs the ``xla`` chunk forward for other chunk sizes on
TPU); the per-token gates as the columns of one ``[B, H, T, 7]`` array (alpha, theta, eta, weight,
start, document, fresh), a token's scalar picked from its column by a masked sum; the memory matrices
as whole ``[m, n]`` blocks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.atlas_memory import _kernel_math as math
from pallas_kernels.atlas_memory._kernel_math import ALPHA, DOCUMENT, ETA, FRESH, START, THETA, WEIGHT
from pallas_kernels.atlas_memory.inputs import AtlasSettings
from pallas_kernels.atlas_memory.memory import pack, unpack

_F32 = jnp.float32


def _column(gates, index):
    return gates[:, index:index + 1]


def _kernel(*refs, settings: AtlasSettings, history: int, has_gain: bool, every: int):
    layout = settings.layout
    count = len(layout.shapes)
    refs = list(refs)
    take = lambda k: [refs.pop(0) for _ in range(k)]  # noqa: E731
    keys_ref, values_ref, queries_ref, gates_ref = take(4)
    carried_keys_ref, carried_values_ref, carried_gates_ref = take(3) if history else (None,) * 3
    initial_refs, memory_in_refs, momentum_in_refs = take(count), take(count), take(count)
    gain = refs.pop(0)[...] if has_gain else None
    y_ref = refs.pop(0)
    memory_out_refs, momentum_out_refs, final_memory_refs, final_momentum_refs = (take(count) for _ in range(4))
    memory_scratch, momentum_scratch = take(count), take(count)
    chunk, num_chunks = pl.program_id(2), pl.num_programs(2)

    @pl.when(chunk == 0)
    def _():
        for scratch, source in zip(memory_scratch + momentum_scratch, memory_in_refs + momentum_in_refs):
            scratch[...] = source[...]

    memory = tuple(r[...] for r in memory_scratch)
    momentum = tuple(r[...] for r in momentum_scratch)

    @pl.when(chunk % every == 0)  # the boundary block stays resident over the ``every`` chunks it covers
    def _():
        for out, value in zip(memory_out_refs + momentum_out_refs, memory + momentum):
            out[...] = value

    initial = tuple(r[...] for r in initial_refs)
    gates = gates_ref[...]
    size = gates.shape[0]

    chunk_factors = math.base_factors(memory, initial, keys_ref[...], values_ref[...], _column(gates, FRESH),
                                      _column(gates, WEIGHT), settings, gain)
    chunk_terms = (chunk_factors, _column(gates, DOCUMENT), jax.lax.broadcasted_iota(jnp.int32, (size, 1), 0))
    carried = None
    if history:
        carried_gates = carried_gates_ref[...]
        carried_factors = math.clipped_factors(
            math.gradient_factors(memory, carried_keys_ref[...], carried_values_ref[...], layout, gain),
            _column(carried_gates, 0), settings.grad_clip)
        carried = (carried_factors, _column(carried_gates, 1),
                   jax.lax.broadcasted_iota(jnp.int32, (history, 1), 0) - history)
    columns = tuple(_column(gates, k) for k in (ALPHA, THETA, ETA, START))

    def token_step(t, state):
        memory, momentum = math.token_update(state, t, chunk_terms, carried, columns, initial, settings)
        query = queries_ref[pl.ds(t, 1), :]
        y_ref[pl.ds(t, 1), :] = math.memory_apply(memory, query, layout, gain).astype(y_ref.dtype)
        return memory, momentum

    memory, momentum = jax.lax.fori_loop(0, size, token_step, (memory, momentum))
    for scratch, value in zip(memory_scratch + momentum_scratch, memory + momentum):
        scratch[...] = value

    @pl.when(chunk == num_chunks - 1)
    def _():
        for out, value in zip(final_memory_refs + final_momentum_refs, memory + momentum):
            out[...] = value


def fits(chunk_size: int, num_chunks: int) -> bool:
    """Whether Mosaic takes the kernel's ``[b, F]`` blocks: b a multiple of 8 (sublanes), or one chunk holds the row."""
    return chunk_size % 8 == 0 or num_chunks == 1


def _head_major(x, size):
    """Chunk-major ``[N, B, b, H, ...]`` -> ``[B, H, N b, ...]``."""
    x = jnp.transpose(x, (1, 3, 0, 2, *range(4, x.ndim)))  # [B, H, N, b, ...] from [N, B, b, H, ...]
    return x.reshape(*x.shape[:2], x.shape[2] * size, *x.shape[4:])


def sweep(carry, xs, windows, initial_memory, gain, settings: AtlasSettings, *, interpret: bool, every: int = 1):
    """The kernel over every chunk: ``(y [N, B, b, H, V], the chunk-start memories and momenta of chunks 0,
    every, 2 every, ... [N / every, B, H, P], final memory and momentum [B, H, P])`` from the chunk scan's
    carry and inputs (``xla.chunked``'s layout) and the carried window of every chunk (``fused.windows``:
    keys, values, weights, documents ``[N, B, c - 1, H, ...]``). Only the kept boundary states are
    written: the forward of ``fused.py`` keeps every K-th, so the other N - N / K never reach HBM."""
    layout, size, history = settings.layout, settings.chunk_size, settings.window - 1
    phi_k, values, phi_q, alpha, theta, eta, gamma, starts, document, _ = xs
    num_chunks, batch, _, heads, features = phi_k.shape
    if every < 1 or num_chunks % every:
        raise ValueError(f"every={every} boundary states must divide the {num_chunks} chunks")
    fresh = jnp.cumsum(starts.astype(jnp.int32), axis=2) > 0  # the token's document started in its chunk
    per_head = lambda x: jnp.broadcast_to(x[..., None], (*x.shape, heads))  # noqa: E731
    gates = jnp.stack([alpha, theta, eta, gamma, per_head(starts.astype(_F32)), per_head(document.astype(_F32)),
                       per_head(fresh.astype(_F32))], axis=-1)
    sequences = [_head_major(x, size) for x in (phi_k, values, phi_q, gates)]
    grid = (batch, heads, num_chunks)

    def rows(width):
        return pl.BlockSpec((None, None, size, width), lambda b, h, n: (b, h, n, 0))

    def matrices(lead):  # [B, H, m, n] (lead 0) or [B, H, N, m, n] (lead 1) blocks of one (row, head)
        if lead:
            return [pl.BlockSpec((None, None, None, m, n), lambda b, h, c: (b, h, c // every, 0, 0))
                    for m, n in layout.shapes]
        return [pl.BlockSpec((None, None, m, n), lambda b, h, c: (b, h, 0, 0)) for m, n in layout.shapes]

    in_specs = [rows(features), rows(layout.value_dim), rows(features), rows(gates.shape[-1])]
    operands = list(sequences)
    if history:
        carried_keys, carried_values, carried_weights, carried_documents = (
            jnp.transpose(x, (1, 3, 0, 2, 4)) for x in
            (windows[0], windows[1], windows[2][..., None],
             per_head(windows[3].astype(_F32))[..., None]))  # [B, H, N, c - 1, ...]
        operands += [carried_keys, carried_values, jnp.concatenate([carried_weights, carried_documents], -1)]
        in_specs += [pl.BlockSpec((None, None, None, history, width), lambda b, h, n: (b, h, n, 0, 0))
                     for width in (features, layout.value_dim, 2)]
    operands += list(initial_memory)
    in_specs += [pl.BlockSpec((None, m, n), lambda b, h, c: (h, 0, 0)) for m, n in layout.shapes]
    operands += list(unpack(carry[0], layout)) + list(unpack(carry[1], layout))
    in_specs += matrices(0) * 2
    if gain is not None:
        operands.append(gain[:, None, :])
        in_specs.append(pl.BlockSpec((None, 1, layout.value_dim), lambda b, h, c: (h, 0, 0)))
    boundary = [jax.ShapeDtypeStruct((batch, heads, num_chunks // every, m, n), _F32) for m, n in layout.shapes]
    final = [jax.ShapeDtypeStruct((batch, heads, m, n), _F32) for m, n in layout.shapes]
    out_shape = [jax.ShapeDtypeStruct((batch, heads, num_chunks * size, layout.value_dim), _F32),
                 *boundary, *boundary, *final, *final]
    out_specs = [rows(layout.value_dim), *matrices(1), *matrices(1), *matrices(0), *matrices(0)]
    scratch = [pltpu.VMEM(shape, _F32) for shape in layout.shapes] * 2
    outputs = pl.pallas_call(
        functools.partial(_kernel, settings=settings, history=history, has_gain=gain is not None, every=every),
        grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape, scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret, name="atlas_memory_chunk_sweep_tpu",
    )(*operands)
    count = len(layout.shapes)
    y, rest = outputs[0], outputs[1:]
    memories, momenta, final_memory, final_momentum = (rest[i * count:(i + 1) * count] for i in range(4))
    y = jnp.moveaxis(y.reshape(batch, heads, num_chunks, size, -1), (0, 1, 2), (1, 3, 0))  # [N, B, b, H, V]
    boundaries = tuple(jnp.moveaxis(pack(m, 3), 2, 0) for m in (memories, momenta))  # [N, B, H, P]
    return y, boundaries, (pack(final_memory, 2), pack(final_momentum, 2))
