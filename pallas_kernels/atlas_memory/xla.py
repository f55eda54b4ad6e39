"""The Atlas memory recurrence in chunk-parallel form (pure JAX around ``linear_scan`` and ``newton_schulz``).

The rule is in the package docstring (``pallas_kernels.atlas_memory``).
``chunked`` (training) runs a ``lax.scan`` over chunks and is parallel inside a chunk:

  1. gradient factors, as rank-1 pairs (left, right), of the chunk's b tokens and of the last
     ``c - 1`` tokens of the previous chunks (their features, values and weights are carried), all
     at this chunk's base: the carried chunk-start memory, or ``M_0`` for a token whose document
     started in this chunk (a carried token's document started before it, so its base is the
     carried memory: its gradient is re-evaluated here, not reused from its own chunk);
  2. ``G`` for the chunk's b tokens as a running window sum over those ``c - 1 + b`` tokens ``j``
     (``g_j = left_j (x) right_j``): a ``linear_scan`` of
     ``G_j = [doc_j = doc_{j-1}] G_{j-1} + g_j - [doc_{j-c} = doc_j] g_{j-c}``, the term entering the
     window added and the one leaving it subtracted (``c + 1`` terms touched per token, not the
     ``c - 1 + b`` of a banded ``[b, c - 1 + b]`` mask); the chunk's tokens are ``j >= c - 1``, whose
     windows lie inside the span. It equals the banded sum up to float32 rounding;
  3. ``S``: ``pallas_kernels.linear_scan`` over the chunk's per-token matrices
     (``a_t = theta_t``, ``a_t = 0`` at a document start, ``b_t = -eta_t G_t``, or ``-G_t``);
  4. ``NS_k(S_t)``: one batched ``newton_schulz`` call per weight matrix over every token's momentum;
  5. ``M``: ``linear_scan`` with ``a_t = alpha_t`` (0 at a document start) and
     ``b_t = NS_k(S_t) + [start_t] alpha_t M_0`` (or ``eta_t NS_k(S_t) + ...``);
  6. the read-out of every token's ``M_t``.

Decays and gates stay ``[B, b, H]`` (``[B, b, H, 1]`` for the scans, whose per-row decays broadcast
over the packed memory ``P`` at use); only the scanned updates are ``[B, b, H, P]``.

The chunk body is rematerialised (``jax.checkpoint``): the backward pass keeps only the carried
states per chunk and recomputes one chunk's per-token matrices at a time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels._chunks import pad_time
from pallas_kernels.atlas_memory.inputs import (AtlasInputs, AtlasSettings, batch_and_heads, broadcast_memory,
                                              document_flags)
from pallas_kernels.atlas_memory.memory import clip_scale, gradient_factors, memory_apply, orthogonalize, pack, unpack
from pallas_kernels.linear_scan import linear_scan


def chunked(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings, *, impl: str,
            partition_spec: PartitionSpec | None) -> tuple[jax.Array, tuple]:
    """``(y [B, T, H, V], M_T)``: outputs (float32) of the recurrence, chunk-parallel (module docstring),
    and the memory after the row's last position, one ``[B, H, m, n]`` per weight matrix.

    ``initial_memory``: ``M_0`` as one ``[H, m, n]`` array per weight matrix.
    """
    batch, length = inputs.segment_ids.shape
    size, history = settings.chunk_size, settings.window - 1
    starts, valid = document_flags(inputs.segment_ids)
    document = jnp.cumsum(starts, axis=1, dtype=jnp.int32)
    gamma = inputs.gamma * valid[..., None]
    # Padding after the row keeps the memory (alpha 1; eta and gamma 0 add nothing), so the carry
    # after the last chunk is the memory after the row's last position.
    # Under ns_granularity = "chunk" theta is 1 there too (the momentum, settled at the chunk's end, is the
    # last position's) and the pending Newton-Schulz scale takes nothing from a padded position.
    padding = [(0, 0), (0, -length % settings.chunk_size), (0, 0)]
    alpha = jnp.pad(inputs.alpha, padding, constant_values=1.0)
    theta = inputs.theta if settings.ns_granularity == "token" else jnp.pad(inputs.theta, padding, constant_values=1.0)
    inside = jnp.ones(inputs.eta.shape, jnp.float32)
    per_token = (inputs.phi_k, inputs.values, inputs.phi_q, alpha, theta, inputs.eta, gamma,
                 starts, document, inside)
    num_chunks = -(-length // size)

    def to_chunks(x):  # [B, T, ...] -> [N, B, b, ...]: chunk-major for the scan
        x = pad_time(x, size)
        return jnp.moveaxis(x.reshape(batch, num_chunks, size, *x.shape[2:]), 1, 0)

    heads = inputs.phi_k.shape[2]
    layout = settings.layout
    carry = (pack(broadcast_memory(initial_memory, batch), 2),
             jnp.zeros((batch, heads, layout.size), jnp.float32),
             jnp.zeros((batch, history, heads, layout.feature_dim), jnp.float32),
             jnp.zeros((batch, history, heads, layout.value_dim), jnp.float32),
             jnp.zeros((batch, history, heads), jnp.float32),
             jnp.full((batch, history), -1, jnp.int32))
    body = jax.checkpoint(functools.partial(_chunk, initial_memory=initial_memory, settings=settings, impl=impl,
                                            specs=_kernel_specs(partition_spec), gain=inputs.norm_gain))
    (memory, *_), outputs = jax.lax.scan(body, carry, tuple(to_chunks(x) for x in per_token))
    outputs = jnp.moveaxis(outputs, 0, 1)
    return outputs.reshape(batch, num_chunks * size, *outputs.shape[3:])[:, :length], unpack(memory, layout)


def _window_gradients(memory, window, initial_memory, layout, clip, gain):
    """Clipped, weighted rank-1 gradient factors of the window's ``c - 1 + b`` tokens at this chunk's base.

    ``window = (phi_k, values, weights, fresh)`` over the carried and the chunk's tokens; ``fresh``:
    the token's document started inside this chunk (base ``M_0``; else the carried memory).
    """
    phi_k, values, weights, fresh = window
    carried = unpack(memory, layout)  # [B, H, m, n]
    # Both candidate base memories in one evaluation: [2, B, 1, H, m, n] against phi [B, c-1+b, H, F].
    bases = tuple(jnp.stack([jnp.broadcast_to(m0, w.shape), w])[:, :, None] for m0, w in zip(initial_memory, carried))
    stacked = tuple(jnp.broadcast_to(x, (2, *x.shape)) for x in (phi_k, values))
    factors = gradient_factors(bases, *stacked, layout, gain)
    fresh = fresh[..., None, None]
    lefts = tuple(jnp.where(fresh, left[0], left[1]) for left, _ in factors)
    rights = tuple(jnp.where(fresh, right[0], right[1]) for _, right in factors)
    # ||left (x) right||_F = ||left|| ||right||: the norm of every token's gradient without forming it.
    norm_sq = sum(jnp.sum(jnp.square(left), -1) * jnp.sum(jnp.square(right), -1) for left, right in zip(lefts, rights))
    scale = (weights * clip_scale(norm_sq, clip))[..., None]
    return tuple(left * scale for left in lefts), rights


def _window_sums(lefts, rights, document, window, impl, spec):
    """``G_t`` packed ``[B, b, H, P]`` for the chunk's tokens from the factors of the ``c - 1 + b`` window tokens
    (``document [B, c - 1 + b]``), by the running sum of the module docstring (step 2)."""
    terms = pack(tuple(left[..., :, None] * right[..., None, :] for left, right in zip(lefts, rights)), 3)
    if window == 1:  # G_t = g_t: nothing to sum
        return terms
    span = terms.shape[1]
    if window < span:  # the term leaving token j's window, g_{j-c}, if it is of j's document
        leaving = (document[:, window:] == document[:, :-window]).astype(terms.dtype)[..., None, None]
        terms = jnp.concatenate([terms[:, :window], terms[:, window:] - leaving * terms[:, :-window]], axis=1)
    same = jnp.concatenate([jnp.zeros_like(document[:, :1], bool), document[:, 1:] == document[:, :-1]], axis=1)
    keep = jnp.broadcast_to(same[..., None, None], (*same.shape, terms.shape[2], 1)).astype(terms.dtype)
    return linear_scan(keep, terms, impl=impl, partition_spec=spec)[:, window - 1:]


def _kernel_specs(partition_spec):
    """``(linear_scan spec of [B, b, H, P], newton_schulz spec of the leading [B, b, H])`` from the inputs' spec."""
    if partition_spec is None:
        return None, None
    batch, heads = batch_and_heads(partition_spec)
    return PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None, heads)


def _scan(decay, update, initial, impl, spec):
    """``linear_scan`` over the chunk's tokens: ``decay [B, b, H]`` broadcast over ``update [B, b, H, P]`` at use."""
    return linear_scan(decay[..., None], update, initial=initial, impl=impl, partition_spec=spec)


def _chunk(carry, chunk, *, initial_memory, settings: AtlasSettings, impl: str, specs, gain):
    memory, momentum, *window_carry = carry
    layout, (scan_spec, ns_spec) = settings.layout, specs
    phi_k, values, phi_q, alpha, theta, eta, gamma, starts, document, inside = chunk
    fresh = jnp.cumsum(starts, axis=1) > 0  # the token's document started inside this chunk
    carried_fresh = jnp.zeros(window_carry[-1].shape, bool)  # carried tokens' documents started earlier
    window = tuple(jnp.concatenate(pair, axis=1) for pair in
                   zip(window_carry, (phi_k, values, gamma, document)))  # keys, values, weights, document
    lefts, rights = _window_gradients(memory, (*window[:3], jnp.concatenate([carried_fresh, fresh], axis=1)),
                                      initial_memory, layout, settings.grad_clip, gain)
    sums = _window_sums(lefts, rights, window[3], settings.window, impl, scan_spec)
    window_carry = tuple(x[:, x.shape[1] - (settings.window - 1):] for x in window)
    keep = 1.0 - starts.astype(jnp.float32)
    on_update = settings.eta_scales == "update"
    gradient_scale = -1.0 if on_update else -eta[..., None]
    momenta = _scan(theta * keep[..., None], gradient_scale * sums, momentum, impl, scan_spec)
    if settings.ns_granularity == "chunk":
        return _chunk_granularity(memory, momenta, window_carry, phi_q, alpha, eta, starts, keep, inside,
                                  initial_memory, settings, impl, specs, gain)
    orthogonal = orthogonalize(unpack(momenta, layout), layout, steps=settings.ns_steps,
                               coefficients=settings.ns_coefficients, impl=impl,
                               lead_spec=ns_spec, dtype=settings.ns_dtype)
    reset = (alpha * starts[..., None])[..., None] * pack(initial_memory, 1)
    update = eta[..., None] * pack(orthogonal, 3) if on_update else pack(orthogonal, 3)
    memories = _scan(alpha * keep[..., None], update + reset, memory, impl, scan_spec)
    outputs = memory_apply(unpack(memories, layout), phi_q, layout, gain)
    return (memories[:, -1], momenta[:, -1], *window_carry), outputs


def _chunk_granularity(memory, momenta, window_carry, phi_q, alpha, eta, starts, keep, inside, initial_memory,
                       settings: AtlasSettings, impl, specs, gain):
    """Steps 4-6 under ``ns_granularity = "chunk"`` (package docstring): the reads through the linearised
    memory ``M~_t = a_t M~_{t-1} + e_t S_t + [start_t] alpha_t M_0`` (a ``linear_scan`` from the chunk-start
    memory), then one ``NS_k(S_end)`` settling the chunk's end:
    ``M_end = A_end M_s + m0_end M_0 + c_end NS_k(S_end)`` with the scalar coefficients scanned alike."""
    layout, (scan_spec, ns_spec) = settings.layout, specs
    decay = alpha * keep[..., None]  # a_t [B, b, H]
    step_scale = (eta if settings.eta_scales == "update" else jnp.ones_like(eta)) * inside  # e_t
    initial_packed = pack(initial_memory, 1)
    reset_scale = alpha * starts[..., None]  # [start_t] alpha_t
    reads = _scan(decay, step_scale[..., None] * momenta + reset_scale[..., None] * initial_packed, memory,
                  impl, scan_spec)
    outputs = memory_apply(unpack(reads, layout), phi_q, layout, gain)
    # [B, b, H, 3]: the chunk-start memory's product of decays, the M_0 coefficient and the pending scale c_t.
    coefficients = _scan(decay, jnp.stack([jnp.zeros_like(alpha), reset_scale, step_scale], axis=-1),
                         jnp.stack([jnp.ones_like(alpha[:, 0]), jnp.zeros_like(alpha[:, 0]),
                                    jnp.zeros_like(alpha[:, 0])], axis=-1), impl, scan_spec)[:, -1]
    end = momenta[:, -1]
    orthogonal = pack(orthogonalize(unpack(end, layout), layout, steps=settings.ns_steps,
                                    coefficients=settings.ns_coefficients, impl=impl,
                                    lead_spec=None if ns_spec is None else PartitionSpec(ns_spec[0], ns_spec[2]),
                                    dtype=settings.ns_dtype), 2)
    settled = (coefficients[..., 0:1] * memory + coefficients[..., 1:2] * initial_packed
               + coefficients[..., 2:3] * orthogonal)
    return (settled, end, *window_carry), outputs
