"""Gated delta rule on TPU: the chunk sweep as a Pallas (Mosaic) kernel, the UT transform in XLA.

The WY / UT form of ``xla.py`` (chunk ``C``, ``gamma`` the cumulative log decay restarted every
chunk, ``T = (I + A)^{-1}``, ``W = T diag(beta e^gamma) K``, ``U~ = T diag(beta) V``) splits into a
state-free, chunk-parallel part and a sequential sweep. The first (``xla.ut_transform``: a batched
triangular solve) stays in XLA, which runs it as batched MXU matmuls. The sweep is one kernel, on a
grid (batch, head, chunk) whose chunk axis is "arbitrary" (sequential) with the float32 state
[K, V] in a VMEM scratch buffer, so neither the chunk-start states nor ``V_new`` ever reach HBM:

    V_new = U~ - W S                                    [C, V]
    o     = scale (e^gamma o (Q S) + (Q K^T o D) V_new)    D_ij = e^{gamma_i - gamma_j}, j <= i
    S    <- e^{gamma_C} S + (K e^{gamma_C - gamma})^T V_new

(``xla.py`` runs the same sweep as a ``lax.scan`` writing every chunk state, then the outputs.)
Matmul operands are float32 (``W``, ``U~`` and the state are float32, as in ``xla.py``); ``q`` and
``k`` come in their own dtype. Layouts as ``chunk_gla/tpu.py``: heads before time, ``gamma`` as a
column [B, H, T, 1] and as chunk rows [B, H, N, 1, C], K and V whole blocks.

Gradient: a ``custom_vjp`` whose backward is autodiff of ``xla.py`` on the same inputs (a
recomputation, as ``newton_schulz`` does for its fused kernels): the forward is the kernel, the
backward costs what the ``xla`` impl's does. A fused Mosaic backward is future work.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _common
from pallas_kernels._chunks import chunk_local_cumsum, pad_time, to_chunks
from pallas_kernels.gated_delta_rule.xla import gated_delta_rule_xla, ut_transform

_F32 = jnp.float32
_PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def _dot(a, b, contract=(1, 0)):
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())), preferred_element_type=_F32)


def _sweep_kernel(q_ref, k_ref, w_ref, u_ref, gamma_col_ref, gamma_row_ref, initial_ref,  # inputs
                  o_ref, final_ref,  # outputs
                  state_ref,  # scratch
                  *, scale):
    chunk, num_chunks = pl.program_id(2), pl.num_programs(2)

    @pl.when(chunk == 0)
    def _():
        state_ref[...] = initial_ref[...]

    state = state_ref[...]
    q, k = q_ref[...].astype(_F32), k_ref[...].astype(_F32)
    gamma, gamma_row = gamma_col_ref[...], gamma_row_ref[...]
    last = gamma[gamma.shape[0] - 1:, :]  # [1, 1]
    v_new = u_ref[...] - _dot(w_ref[...], state)
    size = gamma.shape[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, (size, size), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (size, size), 1)
    decay = jnp.exp(jnp.where(rows >= cols, gamma - gamma_row, -jnp.inf))
    scores = _dot(q, k, (1, 1)) * decay
    o_ref[...] = (scale * (jnp.exp(gamma) * _dot(q, state) + _dot(scores, v_new))).astype(o_ref.dtype)
    new_state = jnp.exp(last) * state + _dot(k * jnp.exp(last - gamma), v_new, (0, 0))
    state_ref[...] = new_state

    @pl.when(chunk == num_chunks - 1)
    def _():
        final_ref[...] = new_state


def _seq_spec(chunk_size, width):
    return pl.BlockSpec((None, None, chunk_size, width), lambda b, h, n: (b, h, n, 0))


def _sweep(q, k, w, u, gamma, initial_state, *, scale, chunk_size):
    """``(o [B, H, T, V] in q.dtype, final_state)`` from head-major inputs; gamma ``[B, H, T]``."""
    batch, heads, steps, key_dim = q.shape
    value_dim = u.shape[-1]
    state_spec = pl.BlockSpec((None, None, key_dim, value_dim), lambda b, h, n: (b, h, 0, 0))
    row_spec = pl.BlockSpec((None, None, None, 1, chunk_size), lambda b, h, n: (b, h, n, 0, 0))
    gamma_row = gamma.reshape(batch, heads, steps // chunk_size, 1, chunk_size)
    return pl.pallas_call(
        functools.partial(_sweep_kernel, scale=scale),
        grid=(batch, heads, steps // chunk_size),
        in_specs=[_seq_spec(chunk_size, key_dim), _seq_spec(chunk_size, key_dim), _seq_spec(chunk_size, key_dim),
                  _seq_spec(chunk_size, value_dim), _seq_spec(chunk_size, 1), row_spec, state_spec],
        out_specs=[_seq_spec(chunk_size, value_dim), state_spec],
        out_shape=(jax.ShapeDtypeStruct((batch, heads, steps, value_dim), q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, key_dim, value_dim), _F32)),
        scratch_shapes=[pltpu.VMEM((key_dim, value_dim), _F32)],
        interpret=_common.interpret_mode(),
        compiler_params=_PARAMS,
        name="gated_delta_rule_sweep_tpu",
    )(q, k, w, u, gamma[..., None], gamma_row, initial_state)


def _forward(q, k, v, beta, log_decay, initial_state, scale, chunk_size):
    batch, length, heads, key_dim = q.shape
    padded = [pad_time(x, chunk_size) for x in (q, k, v, beta.astype(_F32), log_decay.astype(_F32))]
    q_p, k_p, v_p, beta_p, log_decay_p = padded
    gamma = chunk_local_cumsum(log_decay_p, chunk_size)  # [B, T, H]
    chunked = [to_chunks(x.astype(_F32), chunk_size) for x in (k_p, v_p, beta_p, gamma)]
    w, u = ut_transform(*chunked)  # [B, H, N, C, K], [B, H, N, C, V]
    steps = q_p.shape[1]
    w, u = (x.reshape(batch, heads, steps, x.shape[-1]) for x in (w, u))
    q_h, k_h = (jnp.swapaxes(x, 1, 2) for x in (q_p, k_p))
    o, final_state = _sweep(q_h, k_h, w, u, jnp.swapaxes(gamma, 1, 2), initial_state, scale=scale,
                            chunk_size=chunk_size)
    return jnp.swapaxes(o, 1, 2)[:, :length], final_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _rule(q, k, v, beta, log_decay, initial_state, scale, chunk_size):
    return _forward(q, k, v, beta, log_decay, initial_state, scale, chunk_size)


def _rule_fwd(q, k, v, beta, log_decay, initial_state, scale, chunk_size):
    out = _forward(q, k, v, beta, log_decay, initial_state, scale, chunk_size)
    return out, (q, k, v, beta, log_decay, initial_state)


def _rule_bwd(scale, chunk_size, residuals, cotangents):
    def xla_rule(*args):
        return gated_delta_rule_xla(*args[:5], scale=scale, initial_state=args[5], chunk_size=chunk_size)

    # The barrier keeps XLA from fusing the backward's recomputation into what produced the residuals:
    # under model.remat=full, Gated DeltaNet at 2 rows of 4,096 per chip (d_model 1024) otherwise aborts
    # the TPU compiler ("TransformWindow: split of a padded window dim is not supported").
    residuals, cotangents = jax.lax.optimization_barrier((residuals, cotangents))
    _, pullback = jax.vjp(xla_rule, *residuals)
    return pullback(cotangents)


_rule.defvjp(_rule_fwd, _rule_bwd)


def gated_delta_rule_tpu(q, k, v, beta, log_decay=None, *, scale, initial_state=None, chunk_size=64):
    """Caller-layout entry (shapes as ``reference.py``); returns ``(o in q.dtype, final_state float32)``."""
    batch, _, heads, key_dim = q.shape
    if log_decay is None:
        log_decay = jnp.zeros(beta.shape, _F32)
    if initial_state is None:
        initial_state = jnp.zeros((batch, heads, key_dim, v.shape[-1]), _F32)
    return _rule(q, k, v, beta, log_decay.astype(_F32), initial_state.astype(_F32), float(scale), chunk_size)
