"""The Atlas memory as pure functions: feature map, read-out, per-token gradients, orthogonalisation.

Per head, a memory ``M`` maps a feature vector ``phi [F]`` to a value ``[V]``. It is a tuple of
weight matrices (leading axes broadcast, e.g. ``[B, T, H, m, n]`` or ``[H, m, n]``):

    linear (depth 1):  M = (W,)           W [F, V]                 M(phi) = phi W
    deep   (depth 2):  M = (W1, W2)       W1 [F, E], W2 [E, V]     M(phi) = phi[:V] + silu(phi W1) W2

The residual ``phi[:V]`` of the deep memory is the degree-1 block of the features, ``c_1 k``
(keys and values share the head dimension ``V``), so the MLP learns a correction to the identity.

Feature map of a unit key ``k [K]`` with polynomial degree ``p`` and reduced key ``r = k[:R]``:

    phi(k) = [ c_1 k,  c_2 vec(r (x) r),  ...,  c_p vec(r (x) ... (x) r) ]      F = K + sum_{i=2..p} R^i

with learnable per-head coefficients ``c_i`` initialised to ``1/i!`` (a truncated exponential
kernel); ``vec(r^(x)i)`` is the row-major flattening of the i-fold outer product. ``p = 1`` is
``phi(k) = k`` exactly (no coefficient).

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

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from pallas_kernels import newton_schulz
from seqmodels.sharding import kernel_spec


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


def feature_dim(key_dim: int, degree: int, poly_key_dim: int) -> int:
    """``F = K + sum_{i=2..p} R^i``."""
    return key_dim + sum(poly_key_dim**i for i in range(2, degree + 1))


def initial_coefficients(degree: int) -> jax.Array:
    """``[1/1!, 1/2!, ..., 1/p!]``."""
    return jnp.asarray([1.0 / math.factorial(i) for i in range(1, degree + 1)], jnp.float32)


def feature_map(keys: jax.Array, coefficients: jax.Array | None, poly_key_dim: int) -> jax.Array:
    """``phi(keys)``: keys ``[..., H, K]``, coefficients ``[H, p]`` (None: p = 1, identity) -> ``[..., H, F]``."""
    if coefficients is None:
        return keys
    degree = coefficients.shape[-1]
    reduced = keys[..., :poly_key_dim]
    blocks, power = [coefficients[:, 0:1] * keys], reduced
    for i in range(2, degree + 1):
        power = (power[..., :, None] * reduced[..., None, :]).reshape(*keys.shape[:-1], -1)
        blocks.append(coefficients[:, i - 1:i] * power)
    return jnp.concatenate(blocks, axis=-1)


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
                  lead_axes: tuple, dtype="float32") -> tuple:
    """``NS_k`` of every weight matrix in one batched ``newton_schulz`` call (identity when steps = 0).

    ``lead_axes`` are the logical names of the leading axes of the momenta (for shard-local
    execution under a mesh), e.g. ``("batch", None, "heads")``. The call runs on ``dtype``
    operands (bfloat16: bf16 matmuls with float32 accumulation); results are float32.
    """
    if steps == 0:
        return momenta
    momenta = tuple(m.astype(dtype) for m in momenta)
    if not layout.deep:
        spec = kernel_spec(lead_axes, momenta[0].shape[:len(lead_axes)])
        out = newton_schulz(momenta[0], steps=steps, coefficients=coefficients, impl=impl, partition_spec=spec)
        return (out.astype(jnp.float32),)
    w1, w2 = momenta
    pad_rows = layout.feature_dim - layout.value_dim
    w2t = jnp.swapaxes(w2, -1, -2)
    w2t = jnp.pad(w2t, [(0, 0)] * (w2t.ndim - 2) + [(0, pad_rows), (0, 0)])
    stacked = jnp.stack([w1, w2t], axis=-3)  # [..., 2, F, E]
    spec = kernel_spec(lead_axes + (None,), stacked.shape[:len(lead_axes) + 1])
    result = newton_schulz(stacked, steps=steps, coefficients=coefficients, impl=impl,
                           partition_spec=spec).astype(jnp.float32)
    return result[..., 0, :, :], jnp.swapaxes(result[..., 1, :layout.value_dim, :], -1, -2)
