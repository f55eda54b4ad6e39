"""Gated delta rule (Gated DeltaNet; DeltaNet when ``log_decay`` is None), chunked.

Per (batch, head), with state ``S [K, V]`` and per-token gates ``beta_t`` (write strength, usually
in (0, 1)) and ``log_decay_t <= 0``::

    S   = exp(log_decay_t) * S_{t-1}
    u_t = beta_t * (v_t - S^T k_t)
    S_t = S + k_t u_t^T
    o_t = scale * S_t^T q_t                      scale defaults to K ** -0.5

Implementations: ``reference`` (token-by-token scan), ``xla`` (chunked WY / UT-transform form in
pure JAX, see ``xla.py``), ``pallas`` (the target platform's kernels: ``pallas_triton``, Triton
kernels forward and backward, see ``triton.py``; ``pallas_tpu``, the chunk sweep as a Mosaic kernel
with the UT transform in XLA and the backward by autodiff of ``xla.py``, see ``tpu.py``); ``auto``
is ``pallas`` on GPU and TPU and ``xla`` on CPU.
Keys are usually L2-normalised and ``beta`` in (0, 1): that keeps ``S`` bounded.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec

from pallas_kernels import _common
from pallas_kernels.gated_delta_rule.reference import gated_delta_rule_reference
from pallas_kernels.gated_delta_rule.tpu import gated_delta_rule_tpu
from pallas_kernels.gated_delta_rule.triton import gated_delta_rule_pallas
from pallas_kernels.gated_delta_rule.xla import gated_delta_rule_xla

__all__ = ["gated_delta_rule"]


def _check_arguments(q, k, v, beta, log_decay, initial_state):
    for name, x in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        _common.check_float(name, x)
    _common.check_shape("q", q, (None, None, None, None), "[B, T, H, K]")
    batch, length, heads, key_dim = q.shape
    if length < 1:
        raise ValueError(f"q must have at least one time step, got shape {tuple(q.shape)}")
    _common.check_shape("k", k, q.shape, "[B, T, H, K]")
    _common.check_shape("v", v, (batch, length, heads, None), "[B, T, H, V]")
    _common.check_shape("beta", beta, (batch, length, heads), "[B, T, H]")
    if log_decay is not None:
        _common.check_float("log_decay", log_decay)
        _common.check_shape("log_decay", log_decay, (batch, length, heads), "[B, T, H]")
    if initial_state is not None:
        _common.check_float("initial_state", initial_state)
        expected = (batch, heads, key_dim, v.shape[-1])
        _common.check_shape("initial_state", initial_state, expected, "[B, H, K, V]")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(
            f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}"
        )


def _leading_specs(partition_spec):
    """``(batch entry, head entry)`` of a PartitionSpec over ``[B, T, H]``; time must be None."""
    if not isinstance(partition_spec, PartitionSpec):
        raise ValueError(
            f"partition_spec must be a jax.sharding.PartitionSpec over [B, T, H], "
            f"got {partition_spec!r}"
        )
    entries = tuple(partition_spec) + (None,) * (3 - len(partition_spec))
    if len(entries) != 3:
        raise ValueError(
            f"partition_spec must have at most 3 entries for [B, T, H], got {partition_spec}"
        )
    if entries[1] is not None:
        raise ValueError(
            f"partition_spec must not shard the time axis (entry 1 must be None): the recurrence "
            f"runs along it; got {partition_spec}"
        )
    return entries[0], entries[2]


KERNELS = ("pallas_triton", "pallas_tpu")  # Pallas families of this op (``_common.resolve_impl``)


def _resolve(impl: str) -> str:
    return _common.resolve_impl(impl, KERNELS)


def gated_delta_rule(
    q,
    k,
    v,
    beta,
    log_decay=None,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    chunk_size=64,
    impl="auto",
    partition_spec=None,
):
    """Gated delta rule over ``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``beta, log_decay [B, T, H]``.

    Args:
      log_decay: per-token log decay (<= 0); None means no decay (DeltaNet).
      scale: output scale; defaults to ``K ** -0.5``.
      initial_state: ``[B, H, K, V]`` state before the first token; zeros when None.
      output_final_state: also return the state after the last token.
      chunk_size: tokens per chunk of the chunked forms (a power of two >= 16).
      impl: ``"auto" | "reference" | "xla" | "pallas"``.
      partition_spec: PartitionSpec of the leading ``[B, T, H]`` axes of the inputs, e.g.
        ``P(("data", "fsdp"), None, "tensor")``; under ``jax.set_mesh`` the op then runs on each
        device's shard (batch and heads are independent). The time entry must be None.

    Returns:
      ``(o [B, T, H, V] in q.dtype, final_state [B, H, K, V] float32 or None)``. Gradients flow
      to q, k, v, beta, log_decay and initial_state for every impl.
    """
    _check_arguments(q, k, v, beta, log_decay, initial_state)
    _common.check_chunk_size(chunk_size)
    impl = _resolve(impl)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    run = _implementation(impl, scale, chunk_size)
    if partition_spec is not None:
        batch_axes, head_axes = _leading_specs(partition_spec)
        sequence = PartitionSpec(batch_axes, None, head_axes)
        state = PartitionSpec(batch_axes, head_axes)
        in_specs = (sequence, sequence, sequence, sequence, sequence, state)
        in_specs = tuple(
            spec if x is not None else None
            for spec, x in zip(in_specs, (q, k, v, beta, log_decay, initial_state))
        )
        run = _common.shard_local(run, in_specs, (sequence, state))
    o, final_state = run(q, k, v, beta, log_decay, initial_state)
    return o, (final_state if output_final_state else None)


def _implementation(impl, scale, chunk_size):
    """``(q, k, v, beta, log_decay, initial_state) -> (o, final_state)`` for one impl."""

    def run(q, k, v, beta, log_decay, initial_state):
        common = dict(scale=scale, initial_state=initial_state)
        if impl == "reference":
            return gated_delta_rule_reference(q, k, v, beta, log_decay, **common)
        if impl == "xla":
            return gated_delta_rule_xla(q, k, v, beta, log_decay, chunk_size=chunk_size, **common)
        if impl == "pallas_tpu":
            return gated_delta_rule_tpu(q, k, v, beta, log_decay, chunk_size=chunk_size, **common)
        return gated_delta_rule_pallas(
            q, k, v, beta, log_decay, chunk_size=chunk_size,
            interpret=_common.interpret_mode(), **common,
        )

    return run
