"""The Atlas memory recurrence token by token: the one-token decoding step, and the oracle.

``step`` advances one token (decoding); ``reference`` is ``step`` scanned over the row, with the
gradient by ``jax.grad`` of the loss (not the closed form) and a buffer of the last c full
gradient matrices: slow and obviously right.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels.atlas_memory.inputs import AtlasInputs, AtlasSettings, broadcast_memory, document_flags
from pallas_kernels.atlas_memory.memory import clip_scale, memory_apply, memory_loss, orthogonalize


def init_state(batch: int, initial_memory: tuple, settings: AtlasSettings) -> dict:
    """The state before the first token: ``M = M_0``, ``S = 0``, an empty gradient window."""
    memory = broadcast_memory(initial_memory, batch)
    return {"memory": memory, "chunk_memory": memory,
            "momentum": tuple(jnp.zeros_like(w) for w in memory),
            "gradients": tuple(jnp.zeros((batch, settings.window, *w.shape[1:]), w.dtype) for w in memory),
            "position": jnp.zeros((), jnp.int32)}


def step(state: dict, token: tuple, initial_memory: tuple, settings: AtlasSettings, *, impl: str,
         ns_spec: PartitionSpec | None = None):
    """One token: ``token = (phi_k [B, H, F], values [B, H, V], phi_q, alpha, theta, eta, gamma [B, H],
    start [B], valid [B])`` -> ``(state, y [B, H, V])``; the rule of the module docstring, literally."""
    phi_k, values, phi_q, alpha, theta, eta, gamma, start, valid = token
    layout, batch = settings.layout, phi_k.shape[0]
    reset = start[:, None, None, None]
    memory = tuple(jnp.where(reset, m0, m) for m0, m in zip(broadcast_memory(initial_memory, batch),
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
                               impl=impl, lead_spec=ns_spec, dtype=settings.ns_dtype)
    update_scale = eta[..., None, None] if on_update else 1.0
    memory = tuple(alpha[..., None, None] * m + update_scale * n for m, n in zip(memory, orthogonal))
    state = {"memory": memory, "chunk_memory": chunk_memory, "momentum": momentum, "gradients": gradients,
             "position": state["position"] + 1}
    return state, memory_apply(memory, phi_q, layout)


def run_steps(state: dict, inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings,
              starts: jax.Array, valid: jax.Array, *, impl: str, ns_spec: PartitionSpec | None = None):
    """``step`` scanned over the T tokens of ``inputs``: ``(state, y [B, T, H, V])``."""
    time_major = tuple(jnp.moveaxis(x, 1, 0) for x in (*inputs[:7], starts, valid))
    one_token = functools.partial(step, initial_memory=initial_memory, settings=settings, impl=impl, ns_spec=ns_spec)
    state, outputs = jax.lax.scan(one_token, state, time_major)
    return state, jnp.moveaxis(outputs, 0, 1)


def reference(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings) -> jax.Array:
    """Outputs ``y [B, T, H, V]`` token by token, Newton–Schulz by its reference implementation."""
    starts, valid = document_flags(inputs.segment_ids)
    state = init_state(inputs.segment_ids.shape[0], initial_memory, settings)
    return run_steps(state, inputs, initial_memory, settings, starts, valid, impl="reference")[1]
