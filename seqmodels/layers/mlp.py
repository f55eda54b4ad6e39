"""SwiGLU MLP: ``y = W_down (silu(W_gate x) * W_up x)``."""

from __future__ import annotations

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from seqmodels.layers.common import Dense
from seqmodels.sharding import constrain


class SwiGLU(nnx.Module):
    def __init__(self, d_model: int, hidden: int, *, rngs: nnx.Rngs, std: float = 0.02):
        self.gate = Dense(d_model, hidden, "embed", "mlp", rngs=rngs, std=std)
        self.up = Dense(d_model, hidden, "embed", "mlp", rngs=rngs, std=std)
        self.down = Dense(hidden, d_model, "mlp", "embed", rngs=rngs, std=std)

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = jax.nn.silu(self.gate(x)) * self.up(x)
        hidden = checkpoint_name(constrain(hidden, ("batch", "seq", "mlp")), "mlp_hidden")
        return self.down(hidden)
