"""Inputs and settings of the Atlas memory recurrence, and their checks (shared by every form)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels.atlas_memory.memory import MemoryLayout


class AtlasInputs(NamedTuple):
    """Per-token inputs of the recurrence (float32): ``[B, T, H, ...]``, gates ``[B, T, H]``."""

    phi_k: jax.Array      # [B, T, H, F] features of the keys
    values: jax.Array     # [B, T, H, V]
    phi_q: jax.Array      # [B, T, H, F] features of the queries
    alpha: jax.Array      # memory retention
    theta: jax.Array      # momentum
    eta: jax.Array        # inner learning rate
    gamma: jax.Array      # weight of the token's loss in the window
    segment_ids: jax.Array  # [B, T] int; 0 = padding, a change of id starts a document
    norm_gain: jax.Array | None = None  # [H, V] gain of the memory's LayerNorm (MemoryLayout.norm), else None


@dataclasses.dataclass(frozen=True)
class AtlasSettings:
    layout: MemoryLayout
    window: int           # c
    chunk_size: int       # b
    ns_steps: int         # k
    ns_coefficients: str = "muon"
    ns_dtype: str = "float32"  # operand dtype of the Newton-Schulz matmuls (model.compute_dtype)
    grad_clip: float = 0.0     # tau: per-token inner gradient norm bound (0 = none)
    eta_scales: str = "gradient"  # eta_t multiplies the gradient entering S (gradient) or NS_k(S_t) (update)
    ns_granularity: str = "token"  # NS_k of every token's momentum (token: the paper) or once per chunk (chunk)

    def __post_init__(self):
        for name, low in (("window", 1), ("chunk_size", 1), ("ns_steps", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.eta_scales not in ("gradient", "update"):
            raise ValueError(f"eta_scales must be 'gradient' or 'update', got {self.eta_scales!r}")
        if self.ns_granularity not in ("token", "chunk"):
            raise ValueError(f"ns_granularity must be 'token' (Newton-Schulz of every token's momentum) or 'chunk' "
                             f"(once per chunk), got {self.ns_granularity!r}")
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
    if layout.norm != (inputs.norm_gain is not None):
        raise ValueError(f"norm_gain must be an [H, V] array when the memory layout has norm=True and None "
                         f"otherwise; layout norm={layout.norm}, norm_gain "
                         f"{'None' if inputs.norm_gain is None else tuple(inputs.norm_gain.shape)}")
    if layout.norm and tuple(inputs.norm_gain.shape) != (heads, layout.value_dim):
        raise ValueError(f"norm_gain must have shape [H, V] = {(heads, layout.value_dim)}, "
                         f"got {tuple(inputs.norm_gain.shape)}")
    if len(initial_memory) != len(layout.shapes):
        raise ValueError(f"initial_memory must hold {len(layout.shapes)} matrices, got {len(initial_memory)}")
    for i, ((m, n), weight) in enumerate(zip(layout.shapes, initial_memory)):
        if tuple(weight.shape) != (heads, m, n):
            raise ValueError(f"initial_memory[{i}] must have shape [H, m, n] = {(heads, m, n)}, "
                             f"got {tuple(weight.shape)}")


def document_flags(segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(start [B, T], valid [B, T])`` booleans; the first token of the row is a start."""
    changed = segment_ids[:, 1:] != segment_ids[:, :-1]
    starts = jnp.concatenate([jnp.ones((segment_ids.shape[0], 1), bool), changed], axis=1)
    return starts, segment_ids != 0


def broadcast_memory(initial_memory: tuple, batch: int) -> tuple:
    return tuple(jnp.broadcast_to(w, (batch, *w.shape)) for w in initial_memory)


def batch_and_heads(partition_spec: PartitionSpec | None) -> tuple:
    """The batch and head entries of a ``[B, T, H, ...]`` input's spec (``(None, None)`` when there is none)."""
    entries = (() if partition_spec is None else tuple(partition_spec)) + (None,) * 3
    return entries[0], entries[2]
