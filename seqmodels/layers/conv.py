"""Short causal depthwise convolution (the local mixing before recurrent mixers' projections).

    y_t[c] = bias[c] + sum_{j=0}^{K-1} w[j, c] * x_{t-j}[c] * [segment_{t-j} == segment_t]

Tokens of another document (segment) never contribute. For decoding, the cache holds the last
``K - 1`` inputs ``[B, K-1, C]``; a call with a cache processes any number of new tokens after them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from seqmodels.layers.common import constant_param, param


class ShortConv(nnx.Module):
    def __init__(self, channels: int, kernel_size: int, *, rngs: nnx.Rngs, axis_name: str | None = None):
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
        self.kernel_size = kernel_size
        bound = 1.0 / kernel_size**0.5
        self.weight = param(rngs, (kernel_size, channels), (None, axis_name),
                            init=jax.nn.initializers.uniform(2 * bound))
        self.weight.set_value(self.weight.get_value() - bound)  # uniform in [-bound, bound)
        self.bias = constant_param(jnp.zeros((channels,)), (axis_name,))

    def __call__(self, x, *, segment_ids=None, cache=None):
        """``x: [B, T, C]`` -> ``(y [B, T, C], cache)``; ``cache`` is ``[B, K-1, C]`` or None."""
        length, history = x.shape[1], self.kernel_size - 1
        if cache is not None:
            x_full = jnp.concatenate([cache.astype(x.dtype), x], axis=1)
            segments = None
        else:
            x_full = jnp.pad(x, ((0, 0), (history, 0), (0, 0)))
            segments = None if segment_ids is None else jnp.pad(segment_ids, ((0, 0), (history, 0)),
                                                                constant_values=-1)
        weight = self.weight.get_value().astype(x.dtype)
        y = jnp.zeros_like(x) + self.bias.get_value().astype(x.dtype)
        for lag in range(self.kernel_size):
            shifted = x_full[:, history - lag:history - lag + length]
            if segments is not None:
                same = segments[:, history - lag:history - lag + length] == segment_ids
                shifted = shifted * same[..., None].astype(x.dtype)
            y = y + weight[lag] * shifted
        new_cache = x_full[:, x_full.shape[1] - history:] if cache is not None else None
        # Named so that remat policies keep it (seqmodels.models.lm.REMAT_POLICIES): recomputing this
        # pad-and-slice inside a rematerialised backward aborts XLA's TPU compiler.
        return checkpoint_name(y, "short_conv"), new_cache

    def init_cache(self, batch_size: int, channels: int, dtype=jnp.float32):
        return jnp.zeros((batch_size, self.kernel_size - 1, channels), dtype)
