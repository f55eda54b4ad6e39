"""The Atlas memory recurrence (Behrouz et al., "ATLAS: Learning to Optimally Memorize the Context at Test Time", 2025).

Per batch row and head, over the tokens t of a row, with chunks of ``b`` row positions
``[n b, (n + 1) b)`` and the memory functions of ``memory.py`` (``M_0`` is the learnable
initial memory, ``l`` the inner loss ``|| M(phi(k)) - v ||^2``):

    start_t   t is the first token of its document (t = 0, or segment_ids changes at t)
    valid_t   segment_ids_t != 0                        (padding adds no gradient)
    base(t)   M_{s-1}, s = first token of t's chunk     if t's document started before s
              M_0                                       if it started at or after s
    g_i(M)  = gamma_i valid_i clip_tau(grad_M l(M; k_i, v_i))           clip_tau(g) = g min(1, tau / ||g||)
    G_t     = sum_{i = max(t - c + 1, first token of t's document)}^{t} g_i(base(t))   (Omega window)
    S_t     = theta_t S_{t-1} - eta_t G_t               with S_{t-1} := 0    at a document start
    M_t     = alpha_t M_{t-1} + NS_k(S_t)                with M_{t-1} := M_0  at a document start
              (eta_scales = "update": S_t = theta_t S_{t-1} - G_t and M_t = alpha_t M_{t-1} + eta_t NS_k(S_t))
    y_t     = M_t(phi(q_t))

``M(phi)`` is ``memory.memory_apply`` (with ``layout.norm`` its branch is layer-normalised with the
gain ``inputs.norm_gain`` and the residual added: ``memory.py``).

So every window term of token t is evaluated at t's chunk-start memory, the paper's chunk-parallel
form (all gradients of a chunk at ``M_{t'}``, the memory of the chunk start): the terms of tokens
that lie in the previous chunk (the window reaching back ``c - 1`` tokens) are re-evaluated at the
current chunk start, not reused from their own chunk. Nothing (memory, momentum, window) crosses a
document boundary. ``||g||`` is the Frobenius norm over all
of the memory's weight matrices; ``tau = grad_clip``, 0 for no clipping. With ``b = 1``,
``base(t) = M_{t-1}``: the fully online rule. The chunk grid follows the row, not the document: a
document that starts mid-row shares its first chunk with the previous document's tail (but not
its state).

Newton-Schulz per chunk (``settings.ns_granularity = "chunk"``; ``"token"``, the default, is the rule
above, the paper's Eq. 32). A departure from the paper, to run ``NS_k`` once per chunk instead of
once per token. ``G_t``, ``S_t`` and ``base(t)`` are as above; with ``e_t = eta_t`` (``update``) or 1
(``gradient``), ``a_t = alpha_t`` (0 at a document start) and, per chunk ``[s, e]``:

    M~_t  = a_t M~_{t-1} + e_t S_t + [start_t] alpha_t M_0,   M~_{s-1} = M_{s-1}   the read memory
    Mh_t  = a_t Mh_{t-1} + [start_t] alpha_t M_0,             Mh_{s-1} = M_{s-1}   without the updates
    c_t   = a_t c_{t-1} + e_t,                                c_{s-1} = 0
    y_t   = M~_t(phi(q_t))
    M_e   = Mh_e + c_e NS_k(S_e)                                                   once per chunk

So a token reads the chunk-start memory plus the updates of the chunk's tokens up to itself with
``NS_k`` linearised to the identity (TTT's dual form, Sun et al. 2024: inside a mini-batch every
token sees the mini-batch-start weights plus the plain gradient steps before it), and the memory
carried to the next chunk is the token rule's with every ``NS_k(S_t)`` of the chunk replaced by
``NS_k(S_e)``. With ``b = 1`` that memory is the token rule's. A row's last chunk, ended early, is
settled at its last position (``M_T``). Decoding (``reference.step``) keeps ``Mh`` as ``memory``,
``M~`` as ``read_memory`` and ``c`` as ``ns_scale``, on the chunk grid of the state's ``position``;
``reference.settled_memory`` applies a pending chunk. The ``xla`` form reads ``M~`` in TTT's dual
form, masked ``[b, b]`` and ``[b, c - 1 + b]`` matmuls of the window's rank-1 gradient factors, and
forms the chunk's matrices (``S_e``, ``NS_k(S_e)``, ``M_e``) once (``xla._dual_chunk``).

Forms (``impl``): ``reference`` (``reference.py``: ``step`` scanned over the row, gradients by
``jax.grad`` and Newton-Schulz by its reference: slow and obviously right), ``xla`` (``xla.py``: the
chunk-parallel form around ``linear_scan`` and ``newton_schulz``, whose own ``impl`` is the same
value), ``pallas_tpu`` (the fused chunk kernel, ``tpu.py``: a Pallas grid over (row, head, chunk) that
keeps the chunk's memory, momentum and window terms in VMEM and writes only ``y`` and the chunk-start
states; with the chunk-recompute backward of ``fused.py``, a ``custom_vjp`` that recomputes each chunk
from its saved boundary state with the ``xla`` chunk under ``jax.vjp``, in reverse, so no per-token
tensor is kept across chunks; on CPU the kernel runs in the Pallas interpreter; under
``ns_granularity = "chunk"`` the forward is the ``xla`` chunk, with the same backward), ``pallas_triton``
(the same sweep and backward as one Triton kernel per (row, head), ``triton.py``, its blocks zero-padded to
Triton's power-of-two sides; memories with a padded side over ``triton.MAX_SIDE`` run the ``xla`` chunk
forward), ``pallas`` (the target's family: ``pallas_tpu`` on TPU, ``pallas_triton`` elsewhere, in the
interpreter on CPU), ``auto`` (``pallas_tpu`` on TPU; elsewhere each composed op's own choice: on GPU the
Triton Newton-Schulz and scan kernels inside the ``xla`` chunk form, until ``benchmarks/gpu_suite.py``'s
``atlas_memory`` section has timed the fused Triton sweep against it on a GPU).
``atlas_memory_step`` advances a decoding state by the given tokens, one at a time. ``atlas_memory``
also starts from such a state (``initial_state``) and returns the one after the row (``return_state``),
on the chunk grid, in every form: a row split at a chunk boundary runs as its two parts, the second
from the first's state (memory, momentum and the window's last ``c - 1`` tokens), with its outputs
and gradients.

Shapes: ``phi_k, phi_q [B, T, H, F]``, ``values [B, T, H, V]``, gates ``[B, T, H]``, ``segment_ids
[B, T]``; ``initial_memory`` one ``[H, m, n]`` array per weight matrix of ``MemoryLayout.shapes``;
outputs ``y [B, T, H, V]`` float32. ``partition_spec`` gives how ``[B, T, H, ...]`` inputs are sharded
(batch and head entries; time None) so that the kernels inside run shard-local under a mesh.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels import _common
from pallas_kernels.atlas_memory import fused, reference, xla
from pallas_kernels.atlas_memory.inputs import (AtlasInputs, AtlasSettings, batch_and_heads, check_inputs,
                                              document_flags)
from pallas_kernels.atlas_memory.memory import MemoryLayout, memory_apply, memory_loss

__all__ = ["AtlasInputs", "AtlasSettings", "MemoryLayout", "atlas_memory", "atlas_memory_step", "init_state",
           "memory_apply", "memory_loss"]

init_state = reference.init_state
# The Pallas families with a fused chunk kernel (``tpu.py``, ``triton.py``), chosen by ``impl``
# (``_common.resolve_impl``).
FUSED_KERNELS = ("pallas_tpu", "pallas_triton")


def _checked_impl(impl: str) -> str:
    """``impl`` after checking it names an implementation; the ops composed here (``linear_scan``,
    ``newton_schulz``) each resolve it for themselves, so ``auto`` gets every op's own fastest form."""
    _common.resolve_impl(impl, _common.KERNEL_PLATFORMS)
    return impl


def _check(inputs, initial_memory, settings, partition_spec) -> None:
    if not isinstance(settings, AtlasSettings):
        raise ValueError(f"settings must be an AtlasSettings, got {type(settings).__name__}")
    check_inputs(inputs, initial_memory, settings.layout)
    _common.check_partition_spec(partition_spec, 4)


def atlas_memory(inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings, *, impl: str = "auto",
                 partition_spec: PartitionSpec | None = None, return_memory: bool = False,
                 initial_state: dict | None = None, continues=None, return_state: bool = False):
    """Outputs ``y [B, T, H, V]`` (float32) of the recurrence over whole rows (module docstring).

    Args:
      inputs: the per-token ``AtlasInputs`` (float32 features, values and gates; int segment ids; the
        ``[H, V]`` LayerNorm gain when ``settings.layout.norm``).
      initial_memory: ``M_0`` as one ``[H, m, n]`` array per weight matrix.
      settings: window, chunk size, Newton-Schulz steps and schedule, clip, where eta scales.
      impl: ``"auto" | "reference" | "xla" | "pallas" | "pallas_triton" | "pallas_tpu"`` (module docstring).
      partition_spec: how the ``[B, T, H, ...]`` inputs are sharded, e.g. ``P(("data", "fsdp"), None, "tensor")``.
      return_memory: also return ``M_T``, the memory after each row's last position (one
        ``[B, H, m, n]`` float32 array per weight matrix): ``(y, M_T)``.
      initial_state: a state of ``init_state``'s form (as ``atlas_memory_step`` or ``return_state`` gives it)
        to continue from, on the chunk grid (its position a multiple of ``chunk_size``), instead of
        ``init_state``: a row split at a chunk boundary runs as its halves, the second from the first's state.
      continues: ``[B]`` bool, with ``initial_state``: the row's first token continues the state's document
        (default: every row does, as in ``atlas_memory_step``); where it does not, it starts a new one.
      return_state: also return the state after the row (last of the returned tuple): ``(y, state)`` or
        ``(y, M_T, state)``; it needs T to be a multiple of ``chunk_size``.
    """
    _check(inputs, initial_memory, settings, partition_spec)
    batch, length = inputs.segment_ids.shape
    if return_state and length % settings.chunk_size:
        raise ValueError(f"return_state needs rows of a multiple of chunk_size={settings.chunk_size} tokens (a state "
                         f"to continue from lies on the chunk grid), got {length}")
    if initial_state is not None:
        continues = jnp.ones((batch,), bool) if continues is None else jnp.asarray(continues, bool)
        if continues.shape != (batch,):
            raise ValueError(f"continues must have shape [B] = {(batch,)}, got {tuple(continues.shape)}")
    impl = _checked_impl(impl)  # passed on unresolved: auto on TPU is the Mosaic Newton-Schulz but the XLA scan
    scan_chunks, family = None, _common.resolve_impl(impl, _common.KERNEL_PLATFORMS)
    if family in FUSED_KERNELS and (impl != "auto" or family == "pallas_tpu"):
        scan_chunks = functools.partial(fused.scan_chunks, settings=settings, partition_spec=partition_spec,
                                        family=family)
        impl, partition_spec = "auto", None  # the ops composed outside the fused scan; the scan is shard-local
    if impl == "reference":
        y, memory, state = reference.reference(inputs, initial_memory, settings, initial_state, continues)
    else:
        y, memory, state = xla.chunked(inputs, initial_memory, settings, impl=impl, partition_spec=partition_spec,
                                       initial_state=initial_state, continues=continues, return_state=return_state,
                                       scan_chunks=scan_chunks)
    extras = (memory,) * return_memory + (state,) * return_state
    return (y, *extras) if extras else y


def atlas_memory_step(state: dict, inputs: AtlasInputs, initial_memory: tuple, settings: AtlasSettings, *,
                      impl: str = "auto", partition_spec: PartitionSpec | None = None):
    """``(state, y [B, T, H, V])``: the decoding ``state`` (``init_state``) advanced token by token.

    The tokens continue the state's document; a change of segment id among them starts a new one
    (as in training) and a segment id of 0 adds no gradient.
    """
    _check(inputs, initial_memory, settings, partition_spec)
    starts, valid = document_flags(inputs.segment_ids)
    starts = starts.at[:, 0].set(False)  # the first token continues the state's document
    spec = None if partition_spec is None else PartitionSpec(*batch_and_heads(partition_spec))  # [B, H] leads
    return reference.run_steps(state, inputs, initial_memory, settings, starts, valid,
                               impl=_checked_impl(impl), ns_spec=spec)
