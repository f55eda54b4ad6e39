"""The Atlas memory as pure functions: read-out, inner loss, per-token gradients, orthogonalisation.

Per head, a memory ``M`` maps a feature vector ``phi [F]`` to a value ``[V]``. It is a tuple of
weight matrices (leading axes broadcast, e.g. ``[B, T, H, m, n]`` or ``[H, m, n]``):

    linear (depth 1):  M = (W,)           W [F, V]                 M(phi) = phi W
    deep   (depth 2):  M = (W1, W2)       W1 [F, E], W2 [E, V]     M(phi) = phi[:V] + silu(phi W1) W2

The residual ``phi[:V]`` of the deep memory is the degree-1 block of the features (the caller's
feature map puts the key first; keys and values share the head dimension ``V``), so the MLP learns
a correction to the identity.

With ``layout.norm`` (``model.atlas.memory_norm``) the branch is layer-normalised with a learned
gain ``g [V]`` and the residual is added at either depth, the rule of the Titans reference code
(titans-pytorch's ``ResidualNorm``: ``LayerNorm(model(x)) + x``) and of TTT's inner model:

    o = phi W  (linear)  or  silu(phi W1) W2  (deep)                 the branch
    M(phi) = phi[:V] + g * LN(o),   LN(o) = (o - mean(o)) / sqrt(var(o) + eps),  eps = 1e-5

``g`` is an outer parameter (``[H, V]`` per head, learned by the optimiser, fixed within a
sequence); the test-time updates change only the weight matrices. Departure from titans-pytorch,
whose gain is one of the memory's weights (updated by the inner gradient steps, per head): here
Newton-Schulz would turn every step of a ``[1, V]`` gain into a unit-norm vector (NS of a rank-1
matrix is its direction), and TTT, whose inner model titans-pytorch cites for this rule, keeps its
LayerNorm weight as an outer parameter too. LayerNorm has no bias (titans-pytorch: none; TTT: one).
``eps = 1e-5`` is torch's ``LayerNorm`` default, which titans-pytorch uses.

Inner loss of one token and its gradient, in closed form (outer products, ``(x)``):

    l(M; k, v) = || M(phi) - v ||^2,   e = M(phi) - v
    linear:  dl/dW  = phi (x) 2e
    deep:    z = phi W1, a = silu(z)
             dl/dW2 = a (x) 2e,   dl/dW1 = phi (x) ((W2 2e) * silu'(z))

    with norm (gain g):  n = LN(o), u = g * 2e,
             dl/do  = (u - mean(u) - n mean(u * n)) / sqrt(var(o) + eps)       replaces 2e above

``gradient_factors`` returns these as (left, right) vector pairs, one per weight matrix.

Orthogonalisation ``NS_k``: ``pallas_kernels.newton_schulz`` on each weight matrix of the
momentum at its own shape, one batched call per matrix: the deep memory's ``W1 [F, E]`` and
``W2 [E, V]`` each on their smaller Gram side (``NS(F, E) + NS(E, V)`` FLOPs a step, against
``2 NS(F, E)`` for one call over ``W1`` stacked with ``W2^T`` zero-padded to ``[F, E]``: 1.73x the
FLOPs at ``D = 32``). Both give the same matrices (zero rows stay zero through the iteration and
the Frobenius norm is unchanged by padding). ``k = 0`` is the identity (no normalisation either).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels.atlas_memory.constants import NORM_EPS
from pallas_kernels.newton_schulz import newton_schulz


@dataclass(frozen=True)
class MemoryLayout:
    """Dimensions of one head's memory: features F, values V, MLP hidden E (0 = linear memory), and
    whether the branch is layer-normalised with a gain, plus the residual (module docstring)."""

    feature_dim: int
    value_dim: int
    hidden_dim: int = 0
    norm: bool = False

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




def _check_gain(gain, layout: MemoryLayout) -> None:
    if layout.norm and gain is None:
        raise ValueError("a memory with norm=True needs its gain [..., V]; got gain=None")
    if not layout.norm and gain is not None:
        raise ValueError("gain is only used by a memory with norm=True; this layout has norm=False")


def _layer_norm(branch):
    """``(LN(branch), 1 / sqrt(var + eps))`` over the last axis (no gain, no bias)."""
    centred = branch - jnp.mean(branch, axis=-1, keepdims=True)
    inverse_std = jax.lax.rsqrt(jnp.mean(jnp.square(centred), axis=-1, keepdims=True) + NORM_EPS)
    return centred * inverse_std, inverse_std


def _layer_norm_backward(normed, inverse_std, upstream):
    """``dl/d branch`` from ``upstream = dl/d LN(branch)`` (module docstring)."""
    mean_upstream = jnp.mean(upstream, axis=-1, keepdims=True)
    mean_product = jnp.mean(upstream * normed, axis=-1, keepdims=True)
    return inverse_std * (upstream - mean_upstream - normed * mean_product)


def _branch(weights: tuple, phi: jax.Array, layout: MemoryLayout):
    """``(o, hidden pre-activation, hidden)``: the branch output and, deep, its hidden layer (else None)."""
    if not layout.deep:
        return _matvec(phi, weights[0]), None, None
    pre = _matvec(phi, weights[0])
    hidden = jax.nn.silu(pre)
    return _matvec(hidden, weights[1]), pre, hidden


def memory_apply(weights: tuple, phi: jax.Array, layout: MemoryLayout, gain: jax.Array | None = None) -> jax.Array:
    """``M(phi)``: weights ``[..., m, n]`` per matrix, phi ``[..., F]``, gain ``[..., V]`` (norm only; leading
    axes broadcast) -> ``[..., V]``."""
    _check_gain(gain, layout)
    branch, _, _ = _branch(weights, phi, layout)
    return memory_output(branch, phi, layout, gain)


def memory_output(branch: jax.Array, phi: jax.Array, layout: MemoryLayout, gain: jax.Array | None = None) -> jax.Array:
    """``M(phi)`` from its branch ``o [..., V]`` (``phi W`` or ``silu(phi W1) W2``): the residual and the norm."""
    if layout.norm:
        return phi[..., :layout.value_dim] + gain * _layer_norm(branch)[0]
    return phi[..., :layout.value_dim] + branch if layout.deep else branch


def memory_loss(weights: tuple, phi: jax.Array, values: jax.Array, layout: MemoryLayout,
                gain: jax.Array | None = None) -> jax.Array:
    """``sum || M(phi) - v ||^2`` over all leading axes (the reference differentiates this)."""
    return jnp.sum(jnp.square(memory_apply(weights, phi, layout, gain) - values))


def gradient_factors(weights: tuple, phi: jax.Array, values: jax.Array, layout: MemoryLayout,
                     gain: jax.Array | None = None) -> tuple:
    """``((left, right), ...)`` with ``dl/dW_j = left_j (x) right_j`` per token (module docstring)."""
    _check_gain(gain, layout)
    branch, pre, hidden = _branch(weights, phi, layout)
    residual = phi[..., :layout.value_dim] if layout.deep or layout.norm else 0.0
    if layout.norm:
        normed, inverse_std = _layer_norm(branch)
        grad_out = 2.0 * (residual + gain * normed - values)
        grad_branch = _layer_norm_backward(normed, inverse_std, gain * grad_out)
    else:
        grad_branch = 2.0 * (residual + branch - values)
    if not layout.deep:
        return ((phi, grad_branch),)
    grad_pre = jnp.einsum("...ev,...v->...e", weights[1], grad_branch) * _silu_derivative(pre)
    return ((phi, grad_pre), (hidden, grad_branch))


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
    """``NS_k`` of every weight matrix, each at its own shape (identity when steps = 0).

    ``lead_spec`` shards the leading axes of the momenta (e.g. ``[B, b, H]``) for shard-local
    execution under a mesh; None off-mesh. The calls run on ``dtype`` operands (bfloat16: bf16
    matmuls with float32 accumulation, forward and backward); results are float32.
    """
    if len(momenta) != len(layout.shapes):
        raise ValueError(f"momenta must hold {len(layout.shapes)} matrices (one per weight matrix of the layout), "
                         f"got {len(momenta)}")
    if steps == 0:
        return momenta
    return tuple(newton_schulz(m.astype(dtype), steps=steps, coefficients=coefficients, impl=impl,
                               partition_spec=lead_spec).astype(jnp.float32) for m in momenta)
