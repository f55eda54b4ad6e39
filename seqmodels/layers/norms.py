"""RMSNorm (computed in float32, returned in the input dtype), optionally with a SiLU output gate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from seqmodels.layers.common import constant_param


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """``x / sqrt(mean(x^2) + eps)`` over the last axis, in float32."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)


class RMSNorm(nnx.Module):
    """``y = x / rms(x) * scale``; ``scale`` starts at 1. ``axis_name`` is the logical name of the feature axis."""

    def __init__(self, features: int, *, eps: float = 1e-6, axis_name: str | None = "embed"):
        self.eps = eps
        self.scale = constant_param(jnp.ones((features,)), (axis_name,))

    def __call__(self, x: jax.Array, gate: jax.Array | None = None) -> jax.Array:
        """With ``gate``: ``rmsnorm(x) * silu(gate)`` (the gated norm of Mamba2 / DeltaNet outputs)."""
        y = rms_normalize(x, self.eps) * self.scale.get_value()
        if gate is not None:
            y = y * jax.nn.silu(gate.astype(jnp.float32))
        return y.astype(x.dtype)
