"""The memory functions of ``memory.py`` on one head's 2-D blocks, for the fused kernels (``tpu.py``, ``triton.py``).

Every array is 2-D (tokens on sublanes, features on lanes; a per-token scalar is a ``[rows, 1]``
column), every product a 2-D ``dot_general`` with float32 results, every reduction over one axis
with ``keepdims``: the operations Mosaic and the Triton lowering accept. The math is that of
``memory.py`` (``gradient_factors``, ``memory_apply``, ``clip_scale``) and of
``newton_schulz.xla`` (the iteration, its operand policy and its rounding to ``ns_dtype``); the
tests hold the kernels to the ``reference`` oracle.

Zero-padded blocks (the Triton kernel's power-of-two sides): ``residual`` is the ``[rows, V]`` residual
``phi[:, :V]`` given by the caller (Triton cannot slice a block in registers; its padded columns zero) and
``value_count`` the number of true value columns, over which the LayerNorm's means run and outside which
its outputs and gradients are zero. With both None (the Mosaic kernel's unpadded blocks) the residual is
sliced from ``phi`` and every column is true.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.atlas_memory.constants import NORM_EPS
from pallas_kernels.atlas_memory.memory import MemoryLayout
from pallas_kernels.newton_schulz.coefficients import resolve_coefficients
from pallas_kernels.newton_schulz.xla import operand_policy

_F32 = jnp.float32
NS_EPS = 1e-7  # newton_schulz's default eps, which memory.orthogonalize uses
# The per-token gate columns the fused kernels read (alpha, theta, eta, weight, start, document, fresh).
ALPHA, THETA, ETA, WEIGHT, START, DOCUMENT, FRESH = range(7)


def dot(a, b, *, transpose_a=False, transpose_b=False, dtype=_F32, precision=None):
    """``a @ b`` (either side transposed) on ``dtype`` operands, float32 result."""
    contract = ((0 if transpose_a else 1,), (1 if transpose_b else 0,))
    return jax.lax.dot_general(a.astype(dtype), b.astype(dtype), (contract, ((), ())), precision=precision,
                               preferred_element_type=_F32)


def _mean(x, value_count):
    """The mean over the first ``value_count`` columns (all when None) of ``x``, whose other columns are zero."""
    if value_count is None:
        return jnp.mean(x, axis=1, keepdims=True)
    return jnp.sum(x, axis=1, keepdims=True) * (1.0 / value_count)


def _true_columns(x, value_count):
    """``x`` with the columns from ``value_count`` on set to zero (``x`` itself when None)."""
    if value_count is None or value_count == x.shape[1]:
        return x
    columns = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    return jnp.where(columns < value_count, x, 0.0)


def _layer_norm(branch, value_count=None):
    centred = _true_columns(branch - _mean(branch, value_count), value_count)
    inverse_std = jax.lax.rsqrt(_mean(centred * centred, value_count) + NORM_EPS)
    return centred * inverse_std, inverse_std


def _residual(phi, layout: MemoryLayout, residual):
    return phi[:, :layout.value_dim] if residual is None else residual


def _branch(weights, phi, layout: MemoryLayout):
    """``(o, pre, hidden)`` of ``[rows, F]`` features (``pre``, ``hidden`` None for the linear memory)."""
    if not layout.deep:
        return dot(phi, weights[0]), None, None
    pre = dot(phi, weights[0])
    hidden = pre * jax.nn.sigmoid(pre)
    return dot(hidden, weights[1]), pre, hidden


def memory_apply(weights, phi, layout: MemoryLayout, gain, residual=None, value_count=None):
    """``M(phi) [rows, V]`` (``memory.memory_apply``); ``gain [1, V]`` or None; padded blocks: module docstring."""
    branch, _, _ = _branch(weights, phi, layout)
    residual = _residual(phi, layout, residual)
    if layout.norm:
        return residual + gain * _layer_norm(branch, value_count)[0]
    return residual + branch if layout.deep else branch


def gradient_factors(weights, phi, values, layout: MemoryLayout, gain, residual=None, value_count=None):
    """``((left [rows, m], right [rows, n]), ...)`` per weight matrix (``memory.gradient_factors``); padded
    blocks: module docstring."""
    branch, pre, hidden = _branch(weights, phi, layout)
    residual = _residual(phi, layout, residual) if layout.deep or layout.norm else 0.0
    if layout.norm:
        normed, inverse_std = _layer_norm(branch, value_count)
        upstream = gain * 2.0 * (residual + gain * normed - values)
        grad_branch = _true_columns(inverse_std * (upstream - _mean(upstream, value_count)
                                                   - normed * _mean(upstream * normed, value_count)), value_count)
    else:
        grad_branch = 2.0 * (residual + branch - values)
    if not layout.deep:
        return ((phi, grad_branch),)
    sigmoid = jax.nn.sigmoid(pre)
    grad_pre = dot(grad_branch, weights[1], transpose_b=True) * (sigmoid * (1.0 + pre * (1.0 - sigmoid)))
    return ((phi, grad_pre), (hidden, grad_branch))


def clipped_factors(factors, weights_column, clip: float):
    """The factors with each token's left scaled by ``w_t min(1, clip / ||g_t||)`` (``memory.clip_scale``)."""
    scale = weights_column
    if clip:
        norm_sq = sum(jnp.sum(left * left, axis=1, keepdims=True) * jnp.sum(right * right, axis=1, keepdims=True)
                      for left, right in factors)
        scale = scale * (clip * jax.lax.rsqrt(jnp.maximum(norm_sq, clip * clip)))
    return tuple((left * scale, right) for left, right in factors)


def newton_schulz(matrix, schedule, norm_scale: float, eps: float, ns_dtype):
    """``NS_k`` of one ``[m, n]`` float32 matrix as ``memory.orthogonalize`` computes it: the input rounded to
    ``ns_dtype``, normalised, the quintic steps on ``ns_dtype`` operands (``operand_policy``) on the Gram side
    (``X X^T`` when m <= n, else ``X^T X``, as ``newton_schulz.triton`` does), the result rounded to ``ns_dtype``."""
    if not schedule:
        return matrix
    operand_dtype, precision = operand_policy(ns_dtype)
    x = matrix.astype(ns_dtype).astype(_F32)
    sum_squares = jnp.sum(jnp.sum(x * x, axis=1, keepdims=True), axis=0, keepdims=True)  # [1, 1]
    nonzero = sum_squares > 0
    x = jnp.where(nonzero, x / (norm_scale * jnp.sqrt(jnp.where(nonzero, sum_squares, 1.0)) + eps), 0.0)
    tall = x.shape[0] > x.shape[1]
    for a, b, c in schedule:
        mul = lambda p, q, **kw: dot(p, q, dtype=operand_dtype, precision=precision, **kw)  # noqa: E731
        gram = mul(x, x, transpose_a=True) if tall else mul(x, x, transpose_b=True)
        poly = b * gram + c * mul(gram, gram)
        x = a * x + (mul(x, poly) if tall else mul(poly, x))
    return x.astype(ns_dtype).astype(_F32)


def window_column(documents, positions, token, token_document, window: int):
    """``[rows, 1]`` 1.0 where a span token (``positions``: its offset from the chunk start) lies in ``token``'s
    window and document."""
    inside = (positions <= token) & (positions > token - window) & (documents == token_document)
    return inside.astype(_F32)


def base_factors(memory, initial, keys, values, fresh, weight, settings, gain, residual=None, value_count=None):
    """The chunk's tokens' clipped, weighted factors at their base: ``M_0`` where the token's document started in
    the chunk (``fresh [rows, 1]`` > 0), else the chunk-start memory (both evaluated, one selected per token);
    ``weight [rows, 1]`` the tokens' loss weights."""
    layout, fresh = settings.layout, fresh > 0
    at_base = gradient_factors(memory, keys, values, layout, gain, residual, value_count)
    at_initial = gradient_factors(initial, keys, values, layout, gain, residual, value_count)
    selected = tuple((jnp.where(fresh, l0, l), jnp.where(fresh, r0, r))
                     for (l, r), (l0, r0) in zip(at_base, at_initial))
    return clipped_factors(selected, weight, settings.grad_clip)


def token_update(state, token, chunk, carried, gates, initial, settings):
    """The token rule's step at ``token`` of a chunk: ``(M_t, S_t)`` from ``state = (M_{t-1}, S_{t-1})``.

    ``chunk`` and ``carried``: ``(factors, documents [rows, 1], positions [rows, 1])`` of the chunk's tokens and
    of the window's carried tokens (``carried`` None without a window), the factors from ``base_factors`` /
    ``clipped_factors``; ``gates``: the ``[rows, 1]`` columns alpha, theta, eta and start of the chunk's tokens.
    ``G_t`` is the masked product of the factors over t's window and document, then
    ``S_t = theta keep S - eta G_t`` (or ``- G_t`` with eta on the update), ``M_t = alpha keep M + NS_k(S_t)``
    (times eta on the update) ``+ alpha start M_0``, ``keep = 1 - start``."""
    memory, momentum = state
    factors, documents, positions = chunk
    document = pick(documents, token)
    weights = window_column(documents, positions, token, document, settings.window)
    sums = [dot(left * weights, right, transpose_a=True) for left, right in factors]
    if carried is not None:
        carried_factors, carried_documents, carried_positions = carried
        weights = window_column(carried_documents, carried_positions, token, document, settings.window)
        sums = [g + dot(left * weights, right, transpose_a=True) for g, (left, right) in zip(sums, carried_factors)]
    alpha, theta, eta, start = (pick(column, token) for column in gates)
    keep = 1.0 - start
    on_update = settings.eta_scales == "update"
    gradient_scale, update_scale = (1.0, eta) if on_update else (eta, 1.0)
    schedule, norm_scale = resolve_coefficients(settings.ns_coefficients, settings.ns_steps)
    momentum = tuple(theta * keep * s - gradient_scale * g for s, g in zip(momentum, sums))
    orthogonal = tuple(newton_schulz(s, schedule, norm_scale, NS_EPS, settings.ns_dtype) for s in momentum)
    memory = tuple(alpha * keep * m + update_scale * o + alpha * start * m0
                   for m, o, m0 in zip(memory, orthogonal, initial))
    return memory, momentum


def pick(column, index):
    """``column[index]`` as a ``[1, 1]`` array, for a traced ``index``: a masked sum over the sublanes."""
    rows = jax.lax.broadcasted_iota(jnp.int32, column.shape, 0)
    return jnp.sum(jnp.where(rows == index, column, 0.0), axis=0, keepdims=True)
