"""The Atlas memory recurrence: chunk-parallel training form, one-token step, sequential reference.

Per batch row and head, over the tokens t of a row, with chunks of ``b`` row positions
``[n b, (n + 1) b)`` and the memory functions of ``atlas_memory`` (``M_0`` is the learnable
initial memory, ``l`` the inner loss ``|| M(phi(k)) - v ||^2``):

    start_t   t is the first token of its document (t = 0, or segment_ids changes at t)
    valid_t   segment_ids_t != 0                        (padding adds no gradient)
    base(t)   M_{s-1}, s = first token of t's chunk     if t's document started before s
              M_0                                       if it started at or after s
    g_t     = gamma_t valid_t clip_tau(grad_M l(base(t); k_t, v_t))     clip_tau(g) = g min(1, tau / ||g||)
    G_t     = sum_{i = max(t - c + 1, first token of t's document)}^{t} g_i       (Omega window)
    S_t     = theta_t S_{t-1} - eta_t G_t               with S_{t-1} := 0    at a document start
    M_t     = alpha_t M_{t-1} + NS_k(S_t)                with M_{t-1} := M_0  at a document start
              (eta_scales = "update": S_t = theta_t S_{t-1} - G_t and M_t = alpha_t M_{t-1} + eta_t NS_k(S_t))
    y_t     = M_t(phi(q_t))

So every token's gradient is taken at the memory of the start of its chunk (the window reaches
back into earlier chunks, whose gradients were taken at *their* chunk starts), and nothing
(memory, momentum, window) crosses a document boundary. ``||g||`` is the Frobenius norm over all
of the memory's weight matrices; ``tau = grad_clip``, 0 for no clipping. With ``b = 1``,
``base(t) = M_{t-1}``: the fully online rule. The chunk grid follows the row, not the document: a
document that starts mid-row shares its first chunk with the previous document's tail (but not
its state).

``chunked`` (training) runs a ``lax.scan`` over chunks and is parallel inside a chunk:

  1. per-token gradient factors at the carried chunk-start memory and at ``M_0`` (selected per
     token by whether its document started in this chunk), as rank-1 pairs (left, right);
  2. ``G`` for the chunk's b tokens by a banded mask over the chunk's tokens and the last
     ``c - 1`` tokens of the previous chunks (carried): ``G_t = sum_i mask[t, i] left_i (x) right_i``;
  3. ``S``: ``pallas_kernels.linear_scan`` over the chunk's per-token matrices
     (``a_t = theta_t``, ``a_t = 0`` at a document start, ``b_t = -eta_t G_t``, or ``-G_t``);
  4. ``NS_k(S_t)``: ONE batched ``newton_schulz`` call over every token's matrices;
  5. ``M``: ``linear_scan`` with ``a_t = alpha_t`` (0 at a document start) and
     ``b_t = NS_k(S_t) + [start_t] alpha_t M_0``;
  6. the read-out of every token's ``M_t``.

The chunk body is rematerialised (``jax.checkpoint``): the backward pass keeps only the carried
states per chunk and recomputes one chunk's per-token matrices at a time.

``step`` advances one token (decoding); ``reference`` is ``step`` scanned over the row, with the
gradient by ``jax.grad`` of the loss (not the closed form) and a buffer of the last c full
gradient matrices: slow and obviously right.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import linear_scan
from seqmodels.layers.segments import document_starts
from seqmodels.mixers.atlas_memory import (MemoryLayout, clip_scale, gradient_factors, memory_apply, memory_loss,
                                           orthogonalize, pack, unpack)
from seqmodels.sharding import kernel_spec


class AtlasInputs(NamedTuple):
    """Per-token inputs of the recurrence (float32): ``[B, T, H, ...]``, gates ``[B, T, H]``."""

    phi_k: jax.Array      # [B, T, H, F] features of the keys
    values: jax.Array     # [B, T, H, V]
    phi_q: jax.Array      # [B, T, H, F] features of the queries
    alpha: jax.Array      # memory retention
    theta: jax.Array      # momentum
    eta: jax.Array        # inner learning rate
    gamma: jax.Array      # weight of the token's loss in the window
    segment_ids: jax.Array  # [B, T] int; 0 = padding


@dataclasses.dataclass(frozen=True)
class AtlasSettings:
    layout: MemoryLayout
    window: int           # c
    chunk_size: int       # b
    ns_steps: int         # k
    ns_coefficients: str = "muon"
    impl: str = "auto"    # pallas_kernels implementation of linear_scan and newton_schulz
    ns_dtype: str = "float32"  # operand dtype of the Newton-Schulz matmuls (model.compute_dtype)
    grad_clip: float = 0.0     # tau: per-token inner gradient norm bound (0 = none)
    eta_scales: str = "gradient"  # eta_t multiplies the gradient entering S (gradient) or NS_k(S_t) (update)

    def __post_init__(self):
        for name, low in (("window", 1), ("chunk_size", 1), ("ns_steps", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.eta_scales not in ("gradient", "update"):
            raise ValueError(f"eta_scales must be 'gradient' or 'update', got {self.eta_scales!r}")
        if not self.grad_clip >= 0:
            raise ValueError(f"grad_clip must be >= 0 (0 = no clipping), got {self.grad_clip!r}")


def check_inputs(inputs: AtlasInputs, initial_memory: tuple, layout: MemoryLayout) -> None:
    """Raise ``ValueError`` naming the first input whose shape does not fit ``phi_k [B, T, H, F]``."""
    if getattr(inputs.phi_k, "ndim", 0) != 4 or inputs.phi_k.shape[-1] != layout.feature_dim:
        raise ValueError(f"phi_k must have shape [B, T, H, F={layout.feature_dim}], "
                         f"got {tuple(getattr(inputs.phi_k, 'shape', ()))}")
    batch, length, heads, _ = inputs.phi_k.shape
    expected = {"values": (batch, length, heads, layout.value_dim), "phi_q": inputs.phi_k.shape,
                **{gate: (batch, length, heads) for gate in ("alpha", "theta", "eta", "gamma")},
                "segment_ids": (batch, length)}
    for name, shape in expected.items():
        got = tuple(getattr(getattr(inputs, name), "shape", ()))
        if got != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)} (from phi_k [B, T, H, F]), got {got}")
    if len(initial_memory) != len(layout.shapes):
        raise ValueError(f"initial_memory must hold {len(layout.shapes)} matrices, got {len(initial_memory)}")
    for i, ((m, n), weight) in enumerate(zip(layout.shapes, initial_memory)):
        if tuple(weight.shape) != (heads, m, n):
            raise ValueError(f"initial_memory[{i}] must have shape [H, m, n] = {(heads, m, n)}, "
                             f"got {tuple(weight.shape)}")


def document_flags(segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(start [B, T], valid [B, T])`` booleans; the first token of the row is a start."""
    starts = document_starts(segment_ids).at[:, 0].set(True)
    return starts, segment_ids != 0


def _broadcast_memory(initial_memory: tuple, batch: int) -> tuple:
    return tuple(jnp.broadcast_to(w, (batch, *w.shape)) for w in initial_memory)


# ----------------------------------------------------------------------------- chunk-parallel form


def chunked(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings) -> jax.Array:
    """Outputs ``y [B, T, H, V]`` (float32) of the recurrence, chunk-parallel (module docstring).

    ``initial_memory``: ``M_0`` as one ``[H, m, n]`` array per weight matrix.
    """
    check_inputs(inputs, initial_memory, settings.layout)
    batch, length = inputs.segment_ids.shape
    size, history = settings.chunk_size, settings.window - 1
    starts, valid = document_flags(inputs.segment_ids)
    document = jnp.cumsum(starts, axis=1, dtype=jnp.int32)
    gamma = inputs.gamma * valid[..., None]
    per_token = (inputs.phi_k, inputs.values, inputs.phi_q, inputs.alpha, inputs.theta, inputs.eta, gamma,
                 starts, document)
    num_chunks = -(-length // size)
    pad = num_chunks * size - length

    def to_chunks(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(batch, num_chunks, size, *x.shape[2:]), 1, 0)

    heads = inputs.phi_k.shape[2]
    carry = (pack(_broadcast_memory(initial_memory, batch), 2),
             jnp.zeros((batch, heads, settings.layout.size), jnp.float32),
             tuple(jnp.zeros((batch, history, heads, m), jnp.float32) for m, _ in settings.layout.shapes),
             tuple(jnp.zeros((batch, history, heads, n), jnp.float32) for _, n in settings.layout.shapes),
             jnp.full((batch, history), -1, jnp.int32))
    body = jax.checkpoint(functools.partial(_chunk, initial_memory=initial_memory, settings=settings))
    _, outputs = jax.lax.scan(body, carry, tuple(to_chunks(x) for x in per_token))
    outputs = jnp.moveaxis(outputs, 0, 1)
    return outputs.reshape(batch, num_chunks * size, *outputs.shape[3:])[:, :length]


def _token_gradients(memory, chunk, initial_memory, layout, clip):
    """Rank-1 gradient factors of the chunk's tokens, clipped and gamma-weighted, at each token's base memory."""
    phi_k, values, gamma, starts = chunk[0], chunk[1], chunk[6], chunk[7]
    fresh = (jnp.cumsum(starts, axis=1) > 0)[..., None, None]  # document started inside this chunk
    carried = unpack(memory, layout)  # [B, H, m, n]
    # Both candidate base memories in one evaluation: [2, B, 1, H, m, n] against phi [B, b, H, F].
    bases = tuple(jnp.stack([jnp.broadcast_to(m0, w.shape), w])[:, :, None] for m0, w in zip(initial_memory, carried))
    stacked = tuple(jnp.broadcast_to(x, (2, *x.shape)) for x in (phi_k, values))
    factors = gradient_factors(bases, *stacked, layout)
    lefts = tuple(jnp.where(fresh, left[0], left[1]) for left, _ in factors)
    rights = tuple(jnp.where(fresh, right[0], right[1]) for _, right in factors)
    # ||left (x) right||_F = ||left|| ||right||: the norm of every token's gradient without forming it.
    norm_sq = sum(jnp.sum(jnp.square(left), -1) * jnp.sum(jnp.square(right), -1) for left, right in zip(lefts, rights))
    weight = (gamma * clip_scale(norm_sq, clip))[..., None]
    return tuple(left * weight for left in lefts), rights


def _window_sums(lefts, rights, window_carry, document, window):
    """``G_t`` for the chunk's tokens from the carried ``c - 1`` tokens and the chunk: ``[B, b, H, m, n]`` each."""
    carried_lefts, carried_rights, carried_document = window_carry
    size = document.shape[1]
    ext_lefts = tuple(jnp.concatenate(pair, axis=1) for pair in zip(carried_lefts, lefts))
    ext_rights = tuple(jnp.concatenate(pair, axis=1) for pair in zip(carried_rights, rights))
    ext_document = jnp.concatenate([carried_document, document], axis=1)
    token = jnp.arange(size)[:, None]
    extended = jnp.arange(size + window - 1)[None, :]  # extended index i is chunk token i - (c - 1)
    band = (extended >= token) & (extended <= token + window - 1)
    mask = (band[None] & (ext_document[:, None, :] == document[:, :, None])).astype(jnp.float32)
    sums = tuple(jnp.einsum("bti,bihm,bihn->bthmn", mask, left, right) for left, right in zip(ext_lefts, ext_rights))
    new_carry = (tuple(x[:, size:] for x in ext_lefts), tuple(x[:, size:] for x in ext_rights),
                 ext_document[:, size:])
    return sums, new_carry


def _scan(decay, update, initial, impl):
    """``linear_scan`` over the chunk's tokens: ``decay [B, b, H]`` broadcast over ``update [B, b, H, P]``."""
    spec = kernel_spec(("batch", None, "heads", None), update.shape)
    return linear_scan(jnp.broadcast_to(decay[..., None], update.shape), update, initial=initial, impl=impl,
                       partition_spec=spec)


def _chunk(carry, chunk, *, initial_memory, settings: AtlasSettings):
    memory, momentum, *window_carry = carry
    layout = settings.layout
    _, _, phi_q, alpha, theta, eta, _, starts, document = chunk
    lefts, rights = _token_gradients(memory, chunk, initial_memory, layout, settings.grad_clip)
    sums, window_carry = _window_sums(lefts, rights, window_carry, document, settings.window)
    keep = 1.0 - starts.astype(jnp.float32)
    on_update = settings.eta_scales == "update"
    gradient_scale = -1.0 if on_update else -eta[..., None]
    momenta = _scan(theta * keep[..., None], gradient_scale * pack(sums, 3), momentum, settings.impl)
    orthogonal = orthogonalize(unpack(momenta, layout), layout, steps=settings.ns_steps,
                               coefficients=settings.ns_coefficients, impl=settings.impl,
                               lead_axes=("batch", None, "heads"), dtype=settings.ns_dtype)
    reset = (alpha * starts[..., None])[..., None] * pack(initial_memory, 1)
    update = eta[..., None] * pack(orthogonal, 3) if on_update else pack(orthogonal, 3)
    memories = _scan(alpha * keep[..., None], update + reset, memory, settings.impl)
    outputs = memory_apply(unpack(memories, layout), phi_q, layout)
    return (memories[:, -1], momenta[:, -1], *window_carry), outputs


# ----------------------------------------------------------------------------- one-token step, reference


def init_state(batch: int, initial_memory: tuple, settings: AtlasSettings) -> dict:
    """The state before the first token: ``M = M_0``, ``S = 0``, an empty gradient window."""
    memory = _broadcast_memory(initial_memory, batch)
    return {"memory": memory, "chunk_memory": memory,
            "momentum": tuple(jnp.zeros_like(w) for w in memory),
            "gradients": tuple(jnp.zeros((batch, settings.window, *w.shape[1:]), w.dtype) for w in memory),
            "position": jnp.zeros((), jnp.int32)}


def step(state: dict, token: tuple, initial_memory: tuple, settings: AtlasSettings):
    """One token: ``token = (phi_k [B, H, F], values [B, H, V], phi_q, alpha, theta, eta, gamma [B, H],
    start [B], valid [B])`` -> ``(state, y [B, H, V])``; the rule of the module docstring, literally."""
    phi_k, values, phi_q, alpha, theta, eta, gamma, start, valid = token
    layout, batch = settings.layout, phi_k.shape[0]
    reset = start[:, None, None, None]
    memory = tuple(jnp.where(reset, m0, m) for m0, m in zip(_broadcast_memory(initial_memory, batch),
                                                           state["memory"]))
    momentum = tuple(jnp.where(reset, 0.0, s) for s in state["momentum"])
    new_chunk = ((state["position"] % settings.chunk_size == 0) | start)[:, None, None, None]
    chunk_memory = tuple(jnp.where(new_chunk, m, old) for m, old in zip(memory, state["chunk_memory"]))
    grads = jax.grad(memory_loss)(chunk_memory, phi_k, values, layout)  # each (b, h) slice: its own token
    norm_sq = sum(jnp.sum(jnp.square(g), axis=(-2, -1)) for g in grads)
    weight = (gamma * valid[:, None] * clip_scale(norm_sq, settings.grad_clip))[..., None, None]
    gradients = tuple(jnp.concatenate([jnp.where(reset[:, None], 0.0, buf)[:, 1:], (weight * g)[:, None]], axis=1)
                      for buf, g in zip(state["gradients"], grads))
    on_update = settings.eta_scales == "update"
    gradient_scale = 1.0 if on_update else eta[..., None, None]
    momentum = tuple(theta[..., None, None] * s - gradient_scale * jnp.sum(buf, axis=1)
                     for s, buf in zip(momentum, gradients))
    orthogonal = orthogonalize(momentum, layout, steps=settings.ns_steps, coefficients=settings.ns_coefficients,
                               impl=settings.impl, lead_axes=("batch", "heads"), dtype=settings.ns_dtype)
    update_scale = eta[..., None, None] if on_update else 1.0
    memory = tuple(alpha[..., None, None] * m + update_scale * n for m, n in zip(memory, orthogonal))
    state = {"memory": memory, "chunk_memory": chunk_memory, "momentum": momentum, "gradients": gradients,
             "position": state["position"] + 1}
    return state, memory_apply(memory, phi_q, layout)


def run_steps(state: dict, inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings,
              starts: jax.Array, valid: jax.Array):
    """``step`` scanned over the T tokens of ``inputs``: ``(state, y [B, T, H, V])``."""
    time_major = tuple(jnp.moveaxis(x, 1, 0) for x in (*inputs[:7], starts, valid))
    state, outputs = jax.lax.scan(lambda s, tok: step(s, tok, initial_memory, settings), state, time_major)
    return state, jnp.moveaxis(outputs, 0, 1)


def reference(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings) -> jax.Array:
    """Outputs ``y [B, T, H, V]`` token by token, Newton–Schulz by its reference implementation."""
    check_inputs(inputs, initial_memory, settings.layout)
    settings = dataclasses.replace(settings, impl="reference")
    starts, valid = document_flags(inputs.segment_ids)
    state = init_state(inputs.segment_ids.shape[0], initial_memory, settings)
    return run_steps(state, inputs, initial_memory, settings, starts, valid)[1]
