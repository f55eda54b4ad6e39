"""The Atlas memory recurrence in chunk-parallel form (pure JAX around ``linear_scan`` and ``newton_schulz``).

The rule is in the package docstring (``pallas_kernels.atlas_memory``).
``chunked`` (training) runs a ``lax.scan`` over chunks and is parallel inside a chunk:

  1. gradient factors, as rank-1 pairs (left, right), of the chunk's b tokens and of the last
     ``c - 1`` tokens of the previous chunks (their features, values and weights are carried), all
     at this chunk's base: the carried chunk-start memory, or ``M_0`` for a token whose document
     started in this chunk (a carried token's document started before it, so its base is the
     carried memory: its gradient is re-evaluated here, not reused from its own chunk). Each token
     has one base, so the factors are evaluated at the carried memory, and at ``M_0`` only in a
     chunk where some row's document starts (a ``lax.cond`` on that one flag, selecting per token
     as before): a row of one document evaluates ``M_0`` in its first chunk only, where every
     chunk's tokens were once evaluated at both (the same factors, half the work);
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

Under ``ns_granularity = "chunk"`` steps 2-6 are replaced by ``_dual_chunk``: the reads through masked
``[b, b]`` matmuls of the factors (no per-token matrix) and one ``newton_schulz`` call per chunk.

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
from pallas_kernels.atlas_memory.memory import (clip_scale, gradient_factors, memory_apply, memory_output, orthogonalize,
                                              pack, unpack)
from pallas_kernels.linear_scan import linear_scan


def chunked(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings, *, impl: str,
            partition_spec: PartitionSpec | None, initial_state: dict | None = None,
            continues: jax.Array | None = None, return_state: bool = False,
            scan_chunks=None) -> tuple[jax.Array, tuple, dict | None]:
    """``(y [B, T, H, V], M_T, state)``: outputs (float32) of the recurrence, chunk-parallel (module docstring),
    the memory after the row's last position, one ``[B, H, m, n]`` per weight matrix, and with
    ``return_state`` the decoding state after it (``reference.init_state``'s form; else None).

    ``initial_memory``: ``M_0`` as one ``[H, m, n]`` array per weight matrix. ``initial_state``: a decoding
    state on the chunk grid to start from (None: ``M_0``, no momentum, an empty window), whose document the
    first token continues where ``continues [B]`` holds; ``return_state`` needs T a multiple of b.
    ``scan_chunks``: ``(carry, xs, initial_memory, norm_gain) -> (carry, outputs)`` running the chunks in place
    of the rematerialised ``lax.scan`` of ``_chunk`` (``fused.scan_chunks``); None: that scan.
    """
    batch, length = inputs.segment_ids.shape
    size, history = settings.chunk_size, settings.window - 1
    starts, valid = document_flags(inputs.segment_ids)
    if initial_state is not None:
        starts = starts.at[:, 0].set(~continues)
    document = jnp.cumsum(starts, axis=1, dtype=jnp.int32)  # a continued document is 0
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
    if initial_state is None:
        carry = (pack(broadcast_memory(initial_memory, batch), 2),
                 jnp.zeros((batch, heads, layout.size), jnp.float32),
                 jnp.zeros((batch, history, heads, layout.feature_dim), jnp.float32),
                 jnp.zeros((batch, history, heads, layout.value_dim), jnp.float32),
                 jnp.zeros((batch, history, heads), jnp.float32),
                 jnp.full((batch, history), -1, jnp.int32))
    else:
        carry = _carry_from_state(initial_state, continues, history)
    xs = tuple(to_chunks(x) for x in per_token)
    if scan_chunks is None:
        body = jax.checkpoint(functools.partial(_chunk, initial_memory=initial_memory, settings=settings, impl=impl,
                                                specs=_kernel_specs(partition_spec), gain=inputs.norm_gain))
        carry, outputs = jax.lax.scan(body, carry, xs)
    else:
        carry, outputs = scan_chunks(carry, xs, initial_memory, inputs.norm_gain)
    outputs = jnp.moveaxis(outputs, 0, 1)
    outputs = outputs.reshape(batch, num_chunks * size, *outputs.shape[3:])[:, :length]
    state = None
    if return_state:
        position = length + (0 if initial_state is None else initial_state["position"])
        state = _state_from_carry(carry, document[:, -1], position, settings)
    return outputs, unpack(carry[0], layout), state


def _carry_from_state(state: dict, continues: jax.Array, history: int) -> tuple:
    """The chunk scan's carry from a decoding state on the chunk grid: the packed memory and momentum and
    the window's last ``c - 1`` entries (the state's window holds only its last document's tokens, zeros
    before), of document 0, the continued one, where ``continues [B]`` holds and of none (-1) elsewhere."""
    window = tuple(state[name][:, state[name].shape[1] - history:]
                   for name in ("window_keys", "window_values", "window_weights"))
    documents = jnp.broadcast_to(jnp.where(continues, 0, -1)[:, None], (continues.shape[0], history))
    return (pack(state["memory"], 2), pack(state["momentum"], 2), *window, documents.astype(jnp.int32))


def _state_from_carry(carry: tuple, last_document: jax.Array, position, settings: AtlasSettings) -> dict:
    """The decoding state (``reference.init_state``'s form) of a carry at a chunk boundary: the window keeps
    the carried tokens of the last token's document (``last_document [B]``) after one empty entry (the
    oldest, which the next token drops); the chunk's memory and the read memory are the memory itself."""
    memory, momentum, keys, values, weights, documents = carry
    current = documents == last_document[:, None]  # [B, c - 1]

    def window(x):
        kept = jnp.where(current.reshape(*current.shape, *(1,) * (x.ndim - 2)), x, 0.0)
        return jnp.concatenate([jnp.zeros((x.shape[0], 1, *x.shape[2:]), x.dtype), kept], axis=1)

    memory = unpack(memory, settings.layout)
    state = {"memory": memory, "chunk_memory": memory, "momentum": unpack(momentum, settings.layout),
             "window_keys": window(keys), "window_values": window(values), "window_weights": window(weights),
             "position": jnp.asarray(position, jnp.int32)}
    if settings.ns_granularity == "chunk":
        state.update(read_memory=memory, ns_scale=jnp.zeros(memory[0].shape[:2], jnp.float32))
    return state


def _window_gradients(memory, window, initial_memory, layout, clip, gain):
    """Clipped, weighted rank-1 gradient factors of the window's ``c - 1 + b`` tokens at this chunk's base.

    ``window = (phi_k, values, weights, fresh)`` over the carried and the chunk's tokens; ``fresh``:
    the token's document started inside this chunk (base ``M_0``; else the carried memory).
    """
    phi_k, values, weights, fresh = window
    carried = tuple(w[:, None] for w in unpack(memory, layout))  # [B, 1, H, m, n] against phi [B, c-1+b, H, F]
    at_carried = gradient_factors(carried, phi_k, values, layout, gain)

    def with_initial():  # a document starts in the chunk: its tokens' factors at M_0 [1, 1, H, m, n]
        at_initial = gradient_factors(tuple(w[None, None] for w in initial_memory), phi_k, values, layout, gain)
        selected = fresh[..., None, None]
        return tuple((jnp.where(selected, l0, l), jnp.where(selected, r0, r))
                     for (l, r), (l0, r0) in zip(at_carried, at_initial))

    # M_0 is evaluated only where some token's base is M_0: a chunk in which a document starts (module docstring).
    factors = jax.lax.cond(jnp.any(fresh), with_initial, lambda: at_carried)
    lefts, rights = tuple(left for left, _ in factors), tuple(right for _, right in factors)
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
    window_carry = tuple(x[:, x.shape[1] - (settings.window - 1):] for x in window)
    keep = 1.0 - starts.astype(jnp.float32)
    if settings.ns_granularity == "chunk":
        gates = (alpha * keep[..., None], theta * keep[..., None], alpha * starts[..., None], eta, inside)
        carry = _dual_chunk(memory, momentum, lefts, rights, window[3], phi_q, gates, initial_memory, settings,
                            impl, ns_spec, gain)
        return (*carry[:2], *window_carry), carry[2]
    sums = _window_sums(lefts, rights, window[3], settings.window, impl, scan_spec)
    on_update = settings.eta_scales == "update"
    gradient_scale = -1.0 if on_update else -eta[..., None]
    momenta = _scan(theta * keep[..., None], gradient_scale * sums, momentum, impl, scan_spec)
    orthogonal = orthogonalize(unpack(momenta, layout), layout, steps=settings.ns_steps,
                               coefficients=settings.ns_coefficients, impl=impl,
                               lead_spec=ns_spec, dtype=settings.ns_dtype)
    reset = (alpha * starts[..., None])[..., None] * pack(initial_memory, 1)
    update = eta[..., None] * pack(orthogonal, 3) if on_update else pack(orthogonal, 3)
    memories = _scan(alpha * keep[..., None], update + reset, memory, impl, scan_spec)
    outputs = memory_apply(unpack(memories, layout), phi_q, layout, gain)
    return (memories[:, -1], momenta[:, -1], *window_carry), outputs



def _decay_matrix(decay):
    """``D [B, H, b, b]`` with ``D[t, i] = prod_{u = i + 1}^{t} a_u`` for ``t >= i`` (0 above the diagonal) from
    ``a = decay [B, b, H]`` in ``[0, 1]``: log-space segment sums (no differences of cumulative sums), a
    zero factor counted apart so that ``log 0`` never enters."""
    a = jnp.moveaxis(decay, 1, -1)  # [B, H, b]
    size = a.shape[-1]
    zero = a <= 0
    logs = jnp.log(jnp.where(zero, 1.0, a))
    strictly_lower = jnp.tril(jnp.ones((size, size), bool), -1)
    lower = jnp.tril(jnp.ones((size, size), bool))

    def segment_sum(x):  # [t, i] -> sum_{u = i + 1}^{t} x_u
        return jnp.cumsum(jnp.where(strictly_lower, x[..., :, None], 0.0), axis=-2)

    return jnp.where(lower & (segment_sum(zero.astype(jnp.float32)) == 0), jnp.exp(segment_sum(logs)), 0.0)


def _dual_chunk(memory, momentum, lefts, rights, document, phi_q, gates, initial_memory, settings: AtlasSettings,
                impl, ns_spec, gain):
    """One chunk under ``ns_granularity = "chunk"`` (package docstring) in its dual form: no per-token matrix.

    With the window's rank-1 factors ``g_j = l_j (x) r_j`` (``j`` over the ``c - 1 + b`` span), the momentum
    ``S_i = Theta_i S_carry - sum_k Dth[i, k] s_k G_k`` (``s_k = 1``, or ``eta_k`` for ``gradient``) and the
    read memory ``M~_t = A_t M_s + m0_t M_0 + sum_i Da[t, i] e_i S_i`` are linear in ``g_j``, so a token's read
    of a weight matrix from an input ``x_t`` is

        x_t W~_t = A_t x_t W_s + m0_t x_t W_0 + sigma_t x_t S_carry + sum_j C[t, j] (x_t . l_j) r_j
        C = -(Da e) (Dth s) Win          [b, b] [b, b] [b, c - 1 + b] per row and head

    (``Win[k, j]``: ``j`` is in token ``k``'s window and document; ``Da``, ``Dth``: ``_decay_matrix`` of
    ``a_t`` and ``theta_t`` with 0 at a document start), masked matmuls as in TTT's dual form. Only the
    chunk's end forms matrices: ``S_e`` (one weighted sum of the factors), ``NS_k(S_e)`` and ``M_e``.
    Returns ``(M_e, S_e, y)``, packed ``[B, H, P]`` and ``y [B, b, H, V]``."""
    layout = settings.layout
    decay, momentum_decay, reset_scale, eta, inside = gates  # [B, b, H]
    history, size = settings.window - 1, decay.shape[1]
    on_update = settings.eta_scales == "update"
    step_scale = jnp.moveaxis((eta if on_update else jnp.ones_like(eta)) * inside, 1, -1)  # e_t [B, H, b]
    gradient_scale = jnp.ones_like(step_scale) if on_update else jnp.moveaxis(eta, 1, -1)  # s_k
    da, dth = _decay_matrix(decay), _decay_matrix(momentum_decay)  # [B, H, b, b]
    a_first, th_first = jnp.moveaxis(decay[:, :1], 1, -1), jnp.moveaxis(momentum_decay[:, :1], 1, -1)
    cum_a, cum_th = da[..., 0] * a_first, dth[..., 0] * th_first  # A_t, Theta_t [B, H, b]
    read_steps = da * step_scale[..., None, :]  # Da[t, i] e_i
    m0 = jnp.einsum("bhti,bhi->bht", da, jnp.moveaxis(reset_scale, 1, -1))
    sigma = jnp.einsum("bhti,bhi->bht", read_steps, cum_th)
    offset = jnp.arange(history + size)[None, :] - jnp.arange(size)[:, None]  # j - k
    same = document[:, None, history:, None] == document[:, None, None, :]  # [B, 1, b, span]
    window_mask = ((offset >= 0) & (offset <= history))[None, None] & same
    momentum_terms = jnp.einsum("bhik,bhkj->bhij", dth * gradient_scale[..., None, :],
                                window_mask.astype(jnp.float32))  # S_i = Theta_i S_carry - sum_j this[i, j] g_j
    coefficients = -jnp.einsum("bhti,bhij->bhtj", read_steps, momentum_terms)  # C [B, H, b, span]
    weights, carried_momentum = unpack(memory, layout), unpack(momentum, layout)

    def read(index, x):  # x [B, b, H, m] -> x W~_t [B, b, H, n]
        linear = (jnp.moveaxis(cum_a, -1, 1)[..., None] * jnp.einsum("bthm,bhmn->bthn", x, weights[index])
                  + jnp.moveaxis(m0, -1, 1)[..., None] * jnp.einsum("bthm,hmn->bthn", x, initial_memory[index])
                  + jnp.moveaxis(sigma, -1, 1)[..., None] * jnp.einsum("bthm,bhmn->bthn", x,
                                                                        carried_momentum[index]))
        scores = coefficients * jnp.einsum("bthm,bjhm->bhtj", x, lefts[index])
        return linear + jnp.einsum("bhtj,bjhn->bthn", scores, rights[index])

    if layout.deep:
        branch = read(1, jax.nn.silu(read(0, phi_q)))
    else:
        branch = read(0, phi_q)
    outputs = memory_output(branch, phi_q, layout, gain)
    end_terms = momentum_terms[..., -1, :]  # [B, H, span]
    end = tuple(cum_th[..., -1, None, None] * s - jnp.einsum("bhj,bjhm,bjhn->bhmn", end_terms, left, right)
                for s, left, right in zip(carried_momentum, lefts, rights))
    orthogonal = orthogonalize(end, layout, steps=settings.ns_steps, coefficients=settings.ns_coefficients,
                               impl=impl, lead_spec=None if ns_spec is None else PartitionSpec(ns_spec[0], ns_spec[2]),
                               dtype=settings.ns_dtype)
    scale = jnp.sum(read_steps[..., -1, :], axis=-1)  # c_e
    settled = tuple(cum_a[..., -1, None, None] * w + m0[..., -1, None, None] * w0 + scale[..., None, None] * n
                    for w, w0, n in zip(weights, initial_memory, orthogonal))
    return pack(settled, 2), pack(end, 2), outputs
