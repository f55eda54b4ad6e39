"""Parameters with logical axis names, and the dense map every layer uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

Initializer = Callable[[jax.Array, Sequence[int], jnp.dtype], jax.Array]


def param(rngs: nnx.Rngs, shape: Sequence[int], logical_axes: Sequence[str | None],
          init: Initializer | None = None, *, std: float = 0.02) -> nnx.Param:
    """A float32 parameter with one logical axis name per dimension (see ``seqmodels.sharding``)."""
    if len(logical_axes) != len(shape):
        raise ValueError(f"param of shape {tuple(shape)} needs {len(shape)} logical axes, got {tuple(logical_axes)}")
    init = init or jax.nn.initializers.normal(std)
    return nnx.Param(init(rngs.params(), tuple(shape), jnp.float32), logical_axes=tuple(logical_axes))


def constant_param(value: jax.Array, logical_axes: Sequence[str | None]) -> nnx.Param:
    """A float32 parameter initialised to ``value`` (no randomness: norms scales, biases, decays)."""
    value = jnp.asarray(value, jnp.float32)
    if len(logical_axes) != value.ndim:
        raise ValueError(f"param of shape {value.shape} needs {value.ndim} logical axes, got {tuple(logical_axes)}")
    return nnx.Param(value, logical_axes=tuple(logical_axes))


class Dense(nnx.Module):
    """``y = x @ W`` over the last axis of ``x``, computed in ``x.dtype``; W is ``[in, *out_shape]``.

    ``in_axis`` and ``out_axes`` are the logical names of W's dimensions, e.g. a query projection
    ``Dense(d_model, (heads, head_dim), "embed", ("heads", "head_dim"))``.
    """

    def __init__(self, in_features: int, out_shape: int | Sequence[int], in_axis: str | None,
                 out_axes: str | None | Sequence[str | None], *, rngs: nnx.Rngs, std: float = 0.02,
                 use_bias: bool = False):
        out_shape = (out_shape,) if isinstance(out_shape, int) else tuple(out_shape)
        out_axes = (out_axes,) if out_axes is None or isinstance(out_axes, str) else tuple(out_axes)
        self.kernel = param(rngs, (in_features, *out_shape), (in_axis, *out_axes), std=std)
        self.bias = constant_param(jnp.zeros(out_shape), out_axes) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel.get_value().astype(x.dtype)
        y = jnp.tensordot(x, kernel, axes=1)
        if self.bias is not None:
            y = y + self.bias.get_value().astype(x.dtype)
        return y


class DenseOut(nnx.Module):
    """``y = x @ W`` contracting the last ``len(in_shape)`` axes of ``x`` (e.g. heads x head_dim -> embed)."""

    def __init__(self, in_shape: Sequence[int], out_features: int, in_axes: Sequence[str | None],
                 out_axis: str | None, *, rngs: nnx.Rngs, std: float = 0.02):
        self.kernel = param(rngs, (*in_shape, out_features), (*in_axes, out_axis), std=std)

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel.get_value()
        return jnp.tensordot(x, kernel.astype(x.dtype), axes=kernel.ndim - 1)
