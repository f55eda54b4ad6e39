"""The Atlas memory recurrence token by token: the one-token decoding step, and the oracle.

``step`` advances one token (decoding); ``reference`` is ``step`` scanned over the row, with the
gradients by ``jax.grad`` of the loss (not the closed form): the state keeps the last c tokens'
features, values and weights, and every token re-evaluates its whole window's gradients at its own
base memory (its chunk's start; with chunk size 1 that is ``M_{t-1}``): slow and obviously right.

With ``ns_granularity = "chunk"`` (the rule in the package docstring) the state also holds the
linearised read memory ``read_memory`` and the pending Newton-Schulz scale ``ns_scale [B, H]`` of
the current chunk, and ``memory`` is the memory without the chunk's pending update (at a chunk
boundary: the memory). The chunk grid is that of the state's ``position`` (tokens since
``init_state``): a decoded stream that starts at a row's first token has the training form's
grid, and ``NS_k`` runs on the token that ends a chunk (``(position + 1) % b = 0``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels.atlas_memory.inputs import AtlasInputs, AtlasSettings, broadcast_memory, document_flags
from pallas_kernels.atlas_memory.memory import clip_scale, memory_apply, memory_loss, orthogonalize


def init_state(batch: int, initial_memory: tuple, settings: AtlasSettings) -> dict:
    """The state before the first token: ``M = M_0``, ``S = 0``, an empty window (all weights 0)."""
    memory = broadcast_memory(initial_memory, batch)
    heads, features, values = memory[0].shape[1], settings.layout.feature_dim, settings.layout.value_dim
    window = (batch, settings.window, heads)
    return {"memory": memory, "chunk_memory": memory,
            "momentum": tuple(jnp.zeros_like(w) for w in memory),
            "window_keys": jnp.zeros((*window, features), jnp.float32),
            "window_values": jnp.zeros((*window, values), jnp.float32),
            "window_weights": jnp.zeros(window, jnp.float32),
            "position": jnp.zeros((), jnp.int32),
            **({"read_memory": memory, "ns_scale": jnp.zeros((batch, heads), jnp.float32)}
               if settings.ns_granularity == "chunk" else {})}


def _push(buffer, new, reset):
    """Drop the oldest of the window's ``c`` entries, append ``new``; an empty window at a document start."""
    kept = jnp.where(reset.reshape(-1, *([1] * (buffer.ndim - 1))), 0.0, buffer)[:, 1:]
    return jnp.concatenate([kept, new[:, None].astype(buffer.dtype)], axis=1)


def _window_gradient(base, keys, values, weights, layout, clip, gain):
    """``G = sum_i w_i clip(grad l(base; k_i, v_i))`` over the window axis 1: one ``[B, H, m, n]`` per matrix."""
    per_token = tuple(jnp.broadcast_to(w[:, None], (w.shape[0], keys.shape[1], *w.shape[1:])) for w in base)
    grads = jax.grad(memory_loss)(per_token, keys, values, layout, gain)  # each (b, i, h) slice: its own token
    norm_sq = sum(jnp.sum(jnp.square(g), axis=(-2, -1)) for g in grads)
    scale = (weights * clip_scale(norm_sq, clip))[..., None, None]
    return tuple(jnp.sum(scale * g, axis=1) for g in grads)


def step(state: dict, token: tuple, initial_memory: tuple, settings: AtlasSettings, *, impl: str,
         ns_spec: PartitionSpec | None = None, norm_gain: jax.Array | None = None):
    """One token: ``token = (phi_k [B, H, F], values [B, H, V], phi_q, alpha, theta, eta, gamma [B, H],
    start [B], valid [B])`` -> ``(state, y [B, H, V])``; the rule of the module docstring, literally.
    ``norm_gain [H, V]``: the gain of a memory with ``layout.norm``, else None."""
    phi_k, values, phi_q, alpha, theta, eta, gamma, start, valid = token
    layout, batch = settings.layout, phi_k.shape[0]
    reset = start[:, None, None, None]
    memory = tuple(jnp.where(reset, m0, m) for m0, m in zip(broadcast_memory(initial_memory, batch),
                                                           state["memory"]))
    momentum = tuple(jnp.where(reset, 0.0, s) for s in state["momentum"])
    new_chunk = ((state["position"] % settings.chunk_size == 0) | start)[:, None, None, None]
    chunk_memory = tuple(jnp.where(new_chunk, m, old) for m, old in zip(memory, state["chunk_memory"]))
    window = {name: _push(state[name], new, start) for name, new in
              (("window_keys", phi_k), ("window_values", values), ("window_weights", gamma * valid[:, None]))}
    gradient = _window_gradient(chunk_memory, window["window_keys"], window["window_values"],
                                window["window_weights"], layout, settings.grad_clip, norm_gain)
    on_update = settings.eta_scales == "update"
    gradient_scale = 1.0 if on_update else eta[..., None, None]
    momentum = tuple(theta[..., None, None] * s - gradient_scale * g for s, g in zip(momentum, gradient))
    if settings.ns_granularity == "chunk":
        return _chunk_step(state, memory, chunk_memory, momentum, window, phi_q, alpha, eta, reset, settings,
                           impl=impl, ns_spec=ns_spec, norm_gain=norm_gain)
    orthogonal = orthogonalize(momentum, layout, steps=settings.ns_steps, coefficients=settings.ns_coefficients,
                               impl=impl, lead_spec=ns_spec, dtype=settings.ns_dtype)
    update_scale = eta[..., None, None] if on_update else 1.0
    memory = tuple(alpha[..., None, None] * m + update_scale * n for m, n in zip(memory, orthogonal))
    state = {"memory": memory, "chunk_memory": chunk_memory, "momentum": momentum, **window,
             "position": state["position"] + 1}
    return state, memory_apply(memory, phi_q, layout, norm_gain)


def _chunk_step(state, memory, chunk_memory, momentum, window, phi_q, alpha, eta, reset, settings, *, impl, ns_spec,
                norm_gain):
    """The rest of ``step`` under ``ns_granularity = "chunk"`` (package docstring), literally: the read memory
    takes the linearised update ``e_t S_t``, the pending scale ``c_t = alpha_t c_{t-1} + e_t``, and the token
    that ends a chunk settles ``M = M_hat + c NS_k(S)``."""
    layout = settings.layout
    reset_heads = reset[..., 0, 0]
    read = tuple(jnp.where(reset, m, r) for m, r in zip(memory, state["read_memory"]))  # m is M_0 at a reset
    scale = jnp.where(reset_heads, 0.0, state["ns_scale"])
    step_scale = eta if settings.eta_scales == "update" else jnp.ones_like(eta)
    memory = tuple(alpha[..., None, None] * m for m in memory)
    read = tuple(alpha[..., None, None] * r + step_scale[..., None, None] * s for r, s in zip(read, momentum))
    scale = alpha * scale + step_scale
    ends = (state["position"] + 1) % settings.chunk_size == 0
    orthogonal = jax.lax.cond(ends, lambda: orthogonalize(
        momentum, layout, steps=settings.ns_steps, coefficients=settings.ns_coefficients, impl=impl,
        lead_spec=ns_spec, dtype=settings.ns_dtype), lambda: tuple(jnp.zeros_like(s) for s in momentum))
    settled = tuple(m + scale[..., None, None] * n for m, n in zip(memory, orthogonal))
    y = memory_apply(read, phi_q, layout, norm_gain)
    state = {"memory": tuple(jnp.where(ends, s, m) for s, m in zip(settled, memory)), "chunk_memory": chunk_memory,
             "momentum": momentum, **window, "position": state["position"] + 1,
             "read_memory": tuple(jnp.where(ends, s, r) for s, r in zip(settled, read)),
             "ns_scale": jnp.where(ends, 0.0, scale)}
    return state, y


def settled_memory(state: dict, settings: AtlasSettings, *, impl: str, ns_spec: PartitionSpec | None = None) -> tuple:
    """The memory of ``state`` with the current chunk's pending update applied (``ns_granularity = "chunk"``:
    ``M_hat + c NS_k(S)``; the state's ``memory`` itself under ``token``, or at a chunk boundary, where c = 0)."""
    if settings.ns_granularity == "token":
        return state["memory"]
    orthogonal = orthogonalize(state["momentum"], settings.layout, steps=settings.ns_steps,
                               coefficients=settings.ns_coefficients, impl=impl, lead_spec=ns_spec,
                               dtype=settings.ns_dtype)
    return tuple(m + state["ns_scale"][..., None, None] * n for m, n in zip(state["memory"], orthogonal))


def run_steps(state: dict, inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings,
              starts: jax.Array, valid: jax.Array, *, impl: str, ns_spec: PartitionSpec | None = None):
    """``step`` scanned over the T tokens of ``inputs``: ``(state, y [B, T, H, V])``."""
    time_major = tuple(jnp.moveaxis(x, 1, 0) for x in (*inputs[:7], starts, valid))
    one_token = functools.partial(step, initial_memory=initial_memory, settings=settings, impl=impl, ns_spec=ns_spec,
                                  norm_gain=inputs.norm_gain)
    state, outputs = jax.lax.scan(one_token, state, time_major)
    return state, jnp.moveaxis(outputs, 0, 1)


def reference(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings, initial_state: dict | None = None,
              continues: jax.Array | None = None) -> tuple[jax.Array, tuple, dict]:
    """``(y [B, T, H, V], M_T, state)`` token by token, Newton–Schulz by its reference implementation; ``M_T`` the
    memory after the last token, one ``[B, H, m, n]`` per weight matrix (under ``ns_granularity = "chunk"``
    with a last chunk that ends early settled there: ``settled_memory``), ``state`` the state after it.

    From ``initial_state`` (None: ``init_state``) the first token continues the state's document where
    ``continues [B]`` holds, and starts a new one elsewhere."""
    starts, valid = document_flags(inputs.segment_ids)
    if initial_state is None:
        initial_state = init_state(inputs.segment_ids.shape[0], initial_memory, settings)
    else:
        starts = starts.at[:, 0].set(~continues)
    state, y = run_steps(initial_state, inputs, initial_memory, settings, starts, valid, impl="reference")
    return y, settled_memory(state, settings, impl="reference"), state
