"""Parameters with logical axis names, and the dense map every layer uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from seqmodels.sharding import constrain

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


def gathered_weight(variable: nnx.Param, dtype) -> jax.Array:
    """A weight cast to ``dtype`` and all-gathered over the axes its ``embed`` dimension is sharded on
    (``fsdp`` and ``context``: ``seqmodels.sharding.RULES``) for its matmul: ZeRO-3's gather of one
    layer's weights, made explicit rather than left to the partitioner; the backward reduce-scatters the
    gradient back onto the shards. Off a mesh it is the cast."""
    value = variable.get_value().astype(dtype)
    axes = variable.get_metadata()["logical_axes"][-value.ndim:]  # inside a scan over layers: one layer's
    return constrain(value, tuple(None if axis == "embed" else axis for axis in axes))


class Dense(nnx.Module):
    """``y = x @ W`` over the last axis of ``x``, computed in ``x.dtype``; W is ``[in, *out_shape]``.

    ``in_axis`` and ``out_axes`` are the logical names of W's dimensions, e.g. a query projection
    ``Dense(d_model, (heads, head_dim), "embed", ("heads", "head_dim"))``.

    The product is one two-dimensional matmul, ``[..., in] @ [in, prod(out_shape)]``, reshaped after,
    with W all-gathered over its ``embed`` shards first (``gathered_weight``). Both keep XLA's TPU compiler on plain
    dots: a ``tensordot`` into a multi-axis W, or a dot whose weight is still split over ``fsdp`` on its
    contracted axis, became convolutions with padded windows (over the heads axis, or over the fsdp
    shards in the partitioner's collective-permute loop), and at 8,192 tokens per chip a fusion then
    split such a padded window dimension, which aborts the compiler (``TransformWindow: split of a
    padded window dim is not supported``; tests/seqmodels/tools/test_aot.py).
    """

    def __init__(self, in_features: int, out_shape: int | Sequence[int], in_axis: str | None,
                 out_axes: str | None | Sequence[str | None], *, rngs: nnx.Rngs, std: float = 0.02,
                 use_bias: bool = False):
        out_shape = (out_shape,) if isinstance(out_shape, int) else tuple(out_shape)
        out_axes = (out_axes,) if out_axes is None or isinstance(out_axes, str) else tuple(out_axes)
        self.kernel = param(rngs, (in_features, *out_shape), (in_axis, *out_axes), std=std)
        self.bias = constant_param(jnp.zeros(out_shape), out_axes) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = gathered_weight(self.kernel, x.dtype)
        flat = jnp.dot(x, kernel.reshape(kernel.shape[0], -1))
        y = flat.reshape(*x.shape[:-1], *kernel.shape[1:])
        if self.bias is not None:
            y = y + self.bias.get_value().astype(x.dtype)
        return y


class DenseOut(nnx.Module):
    """``y = x @ W`` contracting the last ``len(in_shape)`` axes of ``x`` (e.g. heads x head_dim -> embed),
    as one two-dimensional matmul over the flattened axes (see ``Dense``)."""

    def __init__(self, in_shape: Sequence[int], out_features: int, in_axes: Sequence[str | None],
                 out_axis: str | None, *, rngs: nnx.Rngs, std: float = 0.02):
        self.kernel = param(rngs, (*in_shape, out_features), (*in_axes, out_axis), std=std)

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = gathered_weight(self.kernel, x.dtype)
        contracted = kernel.ndim - 1
        flat = x.reshape(*x.shape[:x.ndim - contracted], -1)
        return jnp.dot(flat, kernel.reshape(-1, kernel.shape[-1]))
