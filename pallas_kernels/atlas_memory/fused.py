"""The chunk scan with a chunk-recompute backward: only some chunk-boundary states are kept for the gradient.

``xla.chunked`` prepares the chunk scan (its carry ``(M, S, window keys, values, weights, documents)``
and the chunk-major inputs ``xs``) and, in the ``pallas_tpu`` and ``pallas_triton`` forms, hands the scan to
``scan_chunks`` here: a ``jax.custom_vjp`` whose

  forward  runs every chunk (the fused kernel of ``tpu.py`` or ``triton.py`` under ``ns_granularity =
           "token"`` at blocks the compiler takes, ``tpu.fits`` / ``triton.fits``; else ``xla._chunk`` in
           a ``lax.scan``) and keeps,
           besides its inputs, the chunk-start states ``(M_s, S_s)`` of every K-th chunk (K the divisor
           of N nearest sqrt(N), ``segment_length``): two ``[N / K, B, H, P]`` arrays, the only boundary
           states the kernel writes (``sweep(every=K)``; a forward without the gradient writes one);
  backward scans the segments of K chunks in reverse; a segment's K chunk-start states are made
           again by the same forward from its saved start (one more forward in all, and ``N / K + K``
           states live instead of N); chunk n is recomputed from its ``(M_s, S_s)`` and its
           carried window (the ``c - 1`` tokens before it, read from the inputs: ``windows``) by
           ``xla._chunk`` under ``jax.vjp``, pulled back with the cotangents of its outputs and of its
           end state (from chunk n + 1), giving those of its start state (to chunk n - 1), its inputs,
           ``M_0`` and the norm gain. Only one chunk's per-token tensors are live at a time.

The carried window is not a state here: its cotangents are pulled back through ``windows`` (a
gather of the inputs) once, after the scan, so the reverse scan carries only ``(dM, dS)``.

Why a custom_vjp and not ``jax.checkpoint`` around the chunk of a ``lax.scan`` (the ``xla`` form):
autodiff of that scan also keeps only the carry of every chunk (the ``c - 1`` window tokens'
features included) and reruns the chunk inside the backward's loop, so the memory it needs is
about the same on CPU (below); but its forward has to be the differentiated function, so it
cannot be a kernel that keeps the chunk's per-token matrices on chip. Here the forward is any
function that returns ``y`` and the boundary states, and the backward is the ``xla`` chunk's own
autodiff: from the ``xla`` forward's boundary states it gives the ``xla`` form's gradients to the
last bit; from the kernel's, which equal them up to float32 rounding, the gradients along the
kernel's trajectory. Composed ops inside the recompute (``linear_scan``, ``newton_schulz``) run at
``impl="auto"`` (on TPU: the Mosaic Newton-Schulz kernel).

Measured (compiled ``memory_analysis().temp_size_in_bytes`` of ``jit(grad)`` of the op, B 2, H 4,
F 96, V 32, E 64, chunk 16, window 8, 5 NS steps; one run each): at T 512, CPU 139.4 MiB ``xla``,
134.0 MiB here (the kernel in the Pallas interpreter); v5e ahead of time 122.5 MiB ``xla``, 81.3 MiB
the former TPU ``auto`` (Mosaic Newton-Schulz, XLA scans), 69.2 MiB here. At T 2048 on v5e: 205.2 MiB
the former ``auto``, 206.8 MiB here with every boundary state kept, 133.0 MiB with every K-th. The
rest is one chunk's backward (its per-token ``[B, b, H, P]`` matrices and Newton-Schulz residuals).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from pallas_kernels import _common
from pallas_kernels.atlas_memory import tpu, triton, xla
from pallas_kernels.atlas_memory.inputs import AtlasSettings, batch_and_heads

_INTS_XS = (7, 8)  # starts (bool) and document (int32) of xs: no cotangent


def windows(carried: tuple, sequences: tuple, size: int) -> tuple:
    """The window carried into every chunk and out of the last: for each ``[B, c - 1, ...]`` carried entry and
    its chunk-major sequence ``[N, B, b, ...]``, ``([N, B, c - 1, ...] into chunk n, [B, c - 1, ...] after the
    row)``: the ``c - 1`` positions before chunk n's start in the carried entry followed by the row."""
    out = []
    for first, sequence in zip(carried, sequences):
        num_chunks, batch = sequence.shape[:2]
        history = first.shape[1]
        row = jnp.moveaxis(sequence, 0, 1).reshape(batch, num_chunks * size, *sequence.shape[3:])
        extended = jnp.concatenate([first, row], axis=1)
        index = jnp.arange(num_chunks + 1)[:, None] * size + jnp.arange(history)[None, :]  # [N + 1, c - 1]
        gathered = jnp.moveaxis(extended[:, index], 1, 0)  # [N + 1, B, c - 1, ...]
        out.append((gathered[:-1], gathered[-1]))
    return tuple(out)


def _window_inputs(carry, xs, size):
    """``windows`` of the carry's window entries (keys, values, weights, documents) over xs's."""
    return windows(carry[2:6], (xs[0], xs[1], xs[6], xs[8]), size)


def _chunk(settings: AtlasSettings):
    return functools.partial(xla._chunk, settings=settings, impl="auto", specs=(None, None))


SWEEPS = {"pallas_tpu": tpu.sweep, "pallas_triton": triton.sweep}  # the fused kernel of each Pallas family


def _forward(carry, xs, initial_memory, gain, settings: AtlasSettings, kernel: str | None, interpret: bool,
             every: int = 1):
    """``((final carry, outputs [N, B, b, H, V]), (chunk-start memories, momenta) [N / every, B, H, P])``: the
    states at the start of chunks 0, every, 2 every, ... (the kernel writes only those). ``kernel``: the family
    whose sweep runs the chunks (``SWEEPS``), or None for the ``xla`` chunk in a ``lax.scan``."""
    window_pairs = _window_inputs(carry, xs, settings.chunk_size)
    final_window = tuple(last for _, last in window_pairs)
    if kernel is not None:
        y, boundaries, (memory, momentum) = SWEEPS[kernel](carry, xs, tuple(into for into, _ in window_pairs),
                                                           initial_memory, gain, settings, interpret=interpret,
                                                           every=every)
        return ((memory, momentum, *final_window), y), boundaries
    chunk = functools.partial(_chunk(settings), initial_memory=initial_memory, gain=gain)

    def step(state, inputs):
        new, y = chunk(state, inputs)
        return new, (y, state[0], state[1])

    final, (y, memories, momenta) = jax.lax.scan(step, carry, xs)
    return (final, y), (memories[::every], momenta[::every])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _scan(carry, xs, initial_memory, gain, settings, kernel, interpret):
    return _forward(carry, xs, initial_memory, gain, settings, kernel, interpret, every=xs[0].shape[0])[0]


def segment_length(num_chunks: int) -> int:
    """K: the divisor of N nearest sqrt(N) (the smaller on a tie); the backward keeps every K-th boundary state."""
    divisors = [k for k in range(1, num_chunks + 1) if num_chunks % k == 0]
    return min(divisors, key=lambda k: (abs(k - num_chunks ** 0.5), k))


def _scan_forward(carry, xs, initial_memory, gain, settings, kernel, interpret):
    segment = segment_length(xs[0].shape[0])
    out, boundaries = _forward(carry, xs, initial_memory, gain, settings, kernel, interpret, every=segment)
    return out, (carry, xs, initial_memory, gain, boundaries)


def _split(xs):
    """``(floats, ints)`` of xs: the differentiable inputs and the starts / document ids."""
    return tuple(x for i, x in enumerate(xs) if i not in _INTS_XS), tuple(xs[i] for i in _INTS_XS)


def _join(floats, ints):
    floats, ints = list(floats), list(ints)
    return tuple(ints.pop(0) if i in _INTS_XS else floats.pop(0) for i in range(len(floats) + len(ints)))


def _zero_cotangent(x):
    return np.zeros(x.shape, jax.dtypes.float0) if not jnp.issubdtype(x.dtype, jnp.floating) else jnp.zeros_like(x)


def _scan_backward(settings, kernel, interpret, residuals, cotangents):
    carry, xs, initial_memory, gain, (memories, momenta) = residuals
    (final_cotangent, y_cotangent) = cotangents
    size = settings.chunk_size
    carry_floats, xs_floats = carry[2:5], _split(xs)[0]

    def gather(carried, xs_floats):  # the float window entries into every chunk and after the row
        pairs = _window_inputs((None, None, *carried, carry[5]), _join(xs_floats, _split(xs)[1]), size)
        return tuple(p[0] for p in pairs[:3]), tuple(p[1] for p in pairs[:3])

    (window_into, _), window_pullback = jax.vjp(gather, carry_floats, xs_floats)
    documents_into = _window_inputs(carry, xs, size)[3][0]
    chunk = _chunk(settings)

    def one_chunk(state_cotangent, inputs):
        memory, momentum, window, documents, chunk_floats, chunk_ints, y_cotangent = inputs
        cotangent_memory, cotangent_momentum, initial_cotangent, gain_cotangent = state_cotangent

        def run(memory, momentum, window, chunk_floats, initial, gain):
            new, y = chunk((memory, momentum, *window, documents), _join(chunk_floats, chunk_ints),
                           initial_memory=initial, gain=gain)
            return (new[0], new[1]), y

        _, pullback = jax.vjp(run, memory, momentum, window, chunk_floats, initial_memory, gain)
        d_memory, d_momentum, d_window, d_floats, d_initial, d_gain = pullback(
            ((cotangent_memory, cotangent_momentum), y_cotangent))
        accumulated = (d_memory, d_momentum, jax.tree.map(jnp.add, initial_cotangent, d_initial),
                       jax.tree.map(jnp.add, gain_cotangent, d_gain))
        return accumulated, (d_window, d_floats)

    start = (final_cotangent[0], final_cotangent[1], jax.tree.map(jnp.zeros_like, initial_memory),
             jax.tree.map(jnp.zeros_like, gain))
    per_chunk = (window_into, documents_into, xs_floats, _split(xs)[1], y_cotangent)
    segment = segment_length(xs[0].shape[0])
    if segment == 1:
        (d_memory, d_momentum, d_initial, d_gain), (d_window, d_floats) = jax.lax.scan(
            one_chunk, start, (memories, momenta, *per_chunk), reverse=True)
    else:
        def one_segment(state_cotangent, inputs):  # the segment's boundary states again, then its chunks in reverse
            memory, momentum, (window, documents, chunk_floats, chunk_ints, y_cotangent) = inputs
            segment_carry = (memory, momentum, *(w[0] for w in window), documents[0])
            _, states = _forward(segment_carry, _join(chunk_floats, chunk_ints), initial_memory, gain, settings,
                                 kernel, interpret)
            return jax.lax.scan(one_chunk, state_cotangent, (*states, window, documents, chunk_floats, chunk_ints,
                                                             y_cotangent), reverse=True)

        grouped = jax.tree.map(lambda x: x.reshape(-1, segment, *x.shape[1:]), per_chunk)
        (d_memory, d_momentum, d_initial, d_gain), per_segment = jax.lax.scan(
            one_segment, start, (memories, momenta, grouped), reverse=True)
        d_window, d_floats = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), per_segment)
    d_carried, d_xs_window = window_pullback((d_window, tuple(final_cotangent[2:5])))
    d_floats = jax.tree.map(jnp.add, d_floats, d_xs_window)
    d_ints = tuple(_zero_cotangent(x) for x in _split(xs)[1])
    d_carry = (d_memory, d_momentum, *d_carried, _zero_cotangent(carry[5]))
    return d_carry, _join(d_floats, d_ints), d_initial, d_gain


_scan.defvjp(_scan_forward, _scan_backward)


def _takes(family: str, settings: AtlasSettings, num_chunks: int) -> bool:
    """Whether ``family``'s compiled kernel takes these blocks (Mosaic: rows of 8; Triton: sides of at most
    ``triton.MAX_SIDE``); the interpreter takes any."""
    if family == "pallas_tpu":
        return tpu.fits(settings.chunk_size, num_chunks)
    return triton.fits(settings.layout)


def scan_chunks(carry, xs, initial_memory, gain, *, settings: AtlasSettings, partition_spec: PartitionSpec | None,
                family: str = "pallas_tpu", interpret: bool | None = None):
    """``(final carry, outputs [N, B, b, H, V])`` of ``xla.chunked``'s chunk scan, with ``family``'s fused kernel
    as the forward (``SWEEPS``; under ``ns_granularity = "token"``) and the chunk-recompute backward (module
    docstring); shard-local under a ``partition_spec`` (XLA cannot partition a Pallas call)."""
    if family not in SWEEPS:
        raise ValueError(f"family must be one of {sorted(SWEEPS)}, got {family!r}")
    interpret = _common.interpret_mode() if interpret is None else interpret
    use_kernel = settings.ns_granularity == "token" and (interpret or _takes(family, settings, xs[0].shape[0]))
    kernel = family if use_kernel else None
    fn = lambda c, x, m, g: _scan(c, x, m, g, settings, kernel, interpret)  # noqa: E731
    if partition_spec is None:
        return fn(carry, xs, initial_memory, gain)
    batch, heads = batch_and_heads(partition_spec)
    state = PartitionSpec(batch, heads, None)  # [B, H, P]
    window = PartitionSpec(batch, None, heads, None)  # [B, c - 1, H, ...]
    carry_specs = (state, state, window, window, PartitionSpec(batch, None, heads), PartitionSpec(batch, None))
    per_token = PartitionSpec(None, batch, None, heads, None)  # [N, B, b, H, ...]
    gate = PartitionSpec(None, batch, None, heads)
    row = PartitionSpec(None, batch, None)
    xs_specs = (per_token,) * 3 + (gate,) * 4 + (row, row, gate)
    memory_specs = tuple(PartitionSpec(heads, None, None) for _ in initial_memory)
    gain_spec = None if gain is None else PartitionSpec(heads, None)
    local = _common.shard_local(fn, (carry_specs, xs_specs, memory_specs, gain_spec), (carry_specs, per_token))
    return local(carry, xs, initial_memory, gain)
