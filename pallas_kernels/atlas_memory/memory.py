"""The Atlas memory as pure functions: read-out, inner loss, per-token gradients, orthogonalisation.

Per head, a memory ``M`` maps a feature vector ``phi [F]`` to a value ``[V]``. It is a tuple of
weight matrices (leading axes broadcast, e.g. ``[B, T, H, m, n]`` or ``[H, m, n]``):

    linear (depth 1):  M = (W,)           W [F, V]                 M(phi) = phi W
    deep   (depth 2):  M = (W1, W2)       W1 [F, E], W2 [E, V]     M(phi) = phi[:V] + silu(phi W1) W2

The residual ``phi[:V]`` of the deep memory is the degree-1 block of the features (the caller's
feature map puts the key first; keys and values share the head dimension ``V``), so the MLP learns
a correction to the identity.

Inner loss of one token and its gradient, in closed form (outer products, ``(x)``):

    l(M; k, v) = || M(phi) - v ||^2,   e = M(phi) - v
    linear:  dl/dW  = phi (x) 2e
    deep:    z = phi W1, a = silu(z), g = 2e
             dl/dW2 = a (x) g,   dl/dW1 = phi (x) ((W2 g) * silu'(z))

``gradient_factors`` returns these as (left, right) vector pairs, one per weight matrix.

Orthogonalisation ``NS_k``: ``pallas_kernels.newton_schulz`` on every weight matrix of the
momentum, in ONE batched call: the deep memory's ``W2^T [V, E]`` is zero-padded to ``[F, E]``
and stacked with ``W1 [F, E]`` (zero rows stay zero through the iteration and the Frobenius
normalisation is unchanged, so the padded result is exactly ``NS(W2^T)`` padded). ``k = 0`` is
the identity (no normalisation either).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels.newton_schulz import newton_schulz


@dataclass(frozen=True)
class MemoryLayout:
    """Dimensions of one head's memory: features F, values V, MLP hidden E (0 = linear memory)."""

    feature_dim: int
    value_dim: int
    hidden_dim: int = 0

    def __post_init__(self):
        if self.feature_dim < self.value_dim or self.value_dim < 1 or self.hidden_dim < 0:
            raise ValueError(f"memory layout needs feature_dim >= value_dim >= 1 and hidden_dim >= 0, got {self}")

    @property
    def deep(self) -> bool:
        return self.hidden_dim > 0

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """Shape ``(m, n)`` of each weight matrix, in the order of the memory tuple."""
        f, v, e = self.feature_dim, self.value_dim, self.hidden_dim
        return ((f, e), (e, v)) if self.deep else ((f, v),)

    @property
    def size(self) -> int:
        """Parameters of one head's memory (the width of its packed vector)."""
        return sum(m * n for m, n in self.shapes)


def _matvec(vector, matrix):
    """``vector [..., m] @ matrix [..., m, n] -> [..., n]`` with broadcasting leading axes."""
    return jnp.einsum("...m,...mn->...n", vector, matrix)


def _silu_derivative(z):
    s = jax.nn.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def memory_apply(weights: tuple, phi: jax.Array, layout: MemoryLayout) -> jax.Array:
    """``M(phi)``: weights ``[..., m, n]`` per matrix, phi ``[..., F]`` (leading axes broadcast) -> ``[..., V]``."""
    if not layout.deep:
        return _matvec(phi, weights[0])
    hidden = jax.nn.silu(_matvec(phi, weights[0]))
    return phi[..., :layout.value_dim] + _matvec(hidden, weights[1])


def memory_loss(weights: tuple, phi: jax.Array, values: jax.Array, layout: MemoryLayout) -> jax.Array:
    """``sum || M(phi) - v ||^2`` over all leading axes (the reference differentiates this)."""
    return jnp.sum(jnp.square(memory_apply(weights, phi, layout) - values))


def gradient_factors(weights: tuple, phi: jax.Array, values: jax.Array, layout: MemoryLayout) -> tuple:
    """``((left, right), ...)`` with ``dl/dW_j = left_j (x) right_j`` per token (module docstring)."""
    if not layout.deep:
        error = _matvec(phi, weights[0]) - values
        return ((phi, 2.0 * error),)
    w1, w2 = weights
    pre = _matvec(phi, w1)
    hidden = jax.nn.silu(pre)
    grad_out = 2.0 * (phi[..., :layout.value_dim] + _matvec(hidden, w2) - values)
    grad_pre = jnp.einsum("...ev,...v->...e", w2, grad_out)
    grad_pre = grad_pre * _silu_derivative(pre)
    return ((phi, grad_pre), (hidden, grad_out))


def clip_scale(norm_sq: jax.Array, clip: float) -> jax.Array:
    """``min(1, clip / ||g||)`` from ``norm_sq = ||g||^2`` (a token's weight matrices together); 1 when clip = 0.

    Smooth at ``g = 0`` (``max`` picks ``clip^2``), so a zero gradient gives finite outer gradients.
    """
    if clip == 0:
        return jnp.ones_like(norm_sq)
    return clip * jax.lax.rsqrt(jnp.maximum(norm_sq, clip * clip))


def pack(matrices: tuple, lead: int) -> jax.Array:
    """Flatten each ``[*lead_axes, m, n]`` matrix after ``lead`` axes and concatenate: ``[*lead_axes, P]``."""
    return jnp.concatenate([m.reshape(*m.shape[:lead], -1) for m in matrices], axis=-1)


def unpack(packed: jax.Array, layout: MemoryLayout) -> tuple:
    """Inverse of ``pack``: ``[..., P]`` -> one ``[..., m, n]`` per weight matrix."""
    out, start = [], 0
    for m, n in layout.shapes:
        out.append(packed[..., start:start + m * n].reshape(*packed.shape[:-1], m, n))
        start += m * n
    return tuple(out)


def orthogonalize(momenta: tuple, layout: MemoryLayout, *, steps: int, coefficients: str, impl: str,
                  lead_spec: PartitionSpec | None = None, dtype="float32") -> tuple:
    """``NS_k`` of every weight matrix in one batched ``newton_schulz`` call (identity when steps = 0).

    ``lead_spec`` shards the leading axes of the momenta (e.g. ``[B, b, H]``) for shard-local
    execution under a mesh; None off-mesh. The call runs on ``dtype`` operands (bfloat16: bf16
    matmuls with float32 accumulation); results are float32.
    """
    if steps == 0:
        return momenta
    momenta = tuple(m.astype(dtype) for m in momenta)
    if not layout.deep:
        out = newton_schulz(momenta[0], steps=steps, coefficients=coefficients, impl=impl, partition_spec=lead_spec)
        return (out.astype(jnp.float32),)
    w1, w2 = momenta
    pad_rows = layout.feature_dim - layout.value_dim
    w2t = jnp.swapaxes(w2, -1, -2)
    w2t = jnp.pad(w2t, [(0, 0)] * (w2t.ndim - 2) + [(0, pad_rows), (0, 0)])
    stacked = jnp.stack([w1, w2t], axis=-3)  # [..., 2, F, E]
    spec = None if lead_spec is None else PartitionSpec(*lead_spec, None)
    result = newton_schulz(stacked, steps=steps, coefficients=coefficients, impl=impl,
                           partition_spec=spec).astype(jnp.float32)
    return result[..., 0, :, :], jnp.swapaxes(result[..., 1, :layout.value_dim, :], -1, -2)
