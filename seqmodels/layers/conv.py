"""Short causal depthwise convolution (the local mixing before recurrent mixers' projections).

    y_t[c] = bias[c] + sum_{j=0}^{K-1} w[j, c] * x_{t-j}[c] * [segment_{t-j} == segment_t]

Tokens of another document (segment) never contribute. For decoding, the cache holds the last
``K - 1`` inputs ``[B, K-1, C]``; a call with a cache processes any number of new tokens after them.
With the sequence split over ``mesh.context`` (training), each shard takes the previous shard's last
``K - 1`` inputs and their segment ids as a halo (``seqmodels.layers.context``; zeros before the row).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from seqmodels.layers.common import constant_param, param
from seqmodels.layers.context import context_map, previous_tail, sequence_is_split
from seqmodels.sharding import sequence_shards


def causal_conv(x_full, segments_full, segment_ids, weight, bias):
    """``y [B, T, C]`` from ``x_full [B, K-1+T, C]`` (K-1 earlier inputs, then the T new ones).

    ``segments_full [B, K-1+T]`` are the segment ids of ``x_full`` and ``segment_ids [B, T]`` those of
    the new tokens, or both None (no masking).
    """
    history = weight.shape[0] - 1
    length = x_full.shape[1] - history
    y = jnp.zeros(x_full[:, history:].shape, x_full.dtype) + bias
    for lag in range(weight.shape[0]):
        shifted = x_full[:, history - lag:history - lag + length]
        if segments_full is not None:
            same = segments_full[:, history - lag:history - lag + length] == segment_ids
            shifted = shifted * same[..., None].astype(x_full.dtype)
        y = y + weight[lag] * shifted
    return y


def _split_sequence_conv(x, segment_ids, weight, bias, channel_axis):
    """``causal_conv`` per ``context`` shard, each with the previous shard's last ``K - 1`` inputs as a halo."""
    shards, history = sequence_shards(), weight.shape[0] - 1

    def local(x, segment_ids, weight, bias):
        x_full = jnp.concatenate([previous_tail(x, history, shards), x], axis=1)
        segments_full = None
        if segment_ids is not None:
            segments_full = jnp.concatenate([previous_tail(segment_ids, history, shards), segment_ids], axis=1)
        return causal_conv(x_full, segments_full, segment_ids, weight, bias)

    sequence = ("batch", "seq", channel_axis)
    return context_map(local, (x, segment_ids, weight, bias),
                       (sequence, ("batch", "seq"), (None, channel_axis), (channel_axis,)), sequence)


class ShortConv(nnx.Module):
    def __init__(self, channels: int, kernel_size: int, *, rngs: nnx.Rngs, axis_name: str | None = None):
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
        self.kernel_size, self.axis_name = kernel_size, axis_name
        bound = 1.0 / kernel_size**0.5
        self.weight = param(rngs, (kernel_size, channels), (None, axis_name),
                            init=jax.nn.initializers.uniform(2 * bound))
        self.weight.set_value(self.weight.get_value() - bound)  # uniform in [-bound, bound)
        self.bias = constant_param(jnp.zeros((channels,)), (axis_name,))

    def __call__(self, x, *, segment_ids=None, cache=None):
        """``x: [B, T, C]`` -> ``(y [B, T, C], cache)``; ``cache`` is ``[B, K-1, C]`` or None."""
        history = self.kernel_size - 1
        weight = self.weight.get_value().astype(x.dtype)
        bias = self.bias.get_value().astype(x.dtype)
        new_cache = None
        if cache is not None:
            x_full = jnp.concatenate([cache.astype(x.dtype), x], axis=1)
            y = causal_conv(x_full, None, None, weight, bias)
            new_cache = x_full[:, x_full.shape[1] - history:]
        elif history and sequence_is_split(x.shape[1]):
            y = _split_sequence_conv(x, segment_ids, weight, bias, self.axis_name)
        else:
            x_full = jnp.pad(x, ((0, 0), (history, 0), (0, 0)))
            segments = None if segment_ids is None else jnp.pad(segment_ids, ((0, 0), (history, 0)),
                                                                constant_values=-1)
            y = causal_conv(x_full, segments, segment_ids, weight, bias)
        # Named so that the "names" remat policy keeps it (seqmodels.models.lm.REMAT_POLICIES).
        return checkpoint_name(y, "short_conv"), new_cache

    def init_cache(self, batch_size: int, channels: int, dtype=jnp.float32):
        return jnp.zeros((batch_size, self.kernel_size - 1, channels), dtype)
