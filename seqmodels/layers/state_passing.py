"""Linear recurrences over a sequence split by ``mesh.context``: state passing between shards.

Each op below takes global arrays (sequence split over ``context``) and runs per shard
(``seqmodels.layers.context``). Per shard c, from a zero state, the chunked kernel gives the shard's
final state ``F_c`` and the shard's transition ``A_c`` is formed; the float32 prefix scan over the
axis gives the incoming state ``S_in_c``; the initial state's contribution is then added:

``split_linear_scan`` (``h_t = a_t * h_{t-1} + b_t``, LongHorn): ``A_c = prod_t a_t`` elementwise and
``h_t += (prod_{s <= t} a_s) * h_in_c``; the running product is a second scan (of ``a`` from ones).

``split_chunk_gla`` (``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``, Mamba2 / SSD, GLA): the transition is
diagonal, ``A_c = exp(sum_t g_t)`` (``[B, H, K, 1]``; a per-head decay broadcasts over K), and the
correction is closed-form: with ``G_t`` the within-shard cumulative log decay,
``o_t += scale * (q_t * exp(G_t))^T S_in_c`` (one ``[K, V]`` read-out per token, float32). One kernel
pass per shard.

``split_gated_delta_rule`` (``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``,
DeltaNet, Gated DeltaNet): the transition is a ``[K, K]`` matrix. Because the update acts on each value
column alone, one kernel pass over the values widened by K zero columns, from the state ``[0 | I_K]``,
returns ``[F_c | A_c]`` (the zero columns carry the identity through the transitions). A second pass
from ``S_in_c`` gives the outputs: two kernel passes per shard, the first ``(V + K) / V`` as wide.

``split_momentum_scan`` (MuonSSM, ``pallas_kernels.momentum_scan``: ``M_t = e^{h_t} M_{t-1} + W_t``,
``S_t = A_t(S_{t-1}) + M_t``): the same widening over the pair ``(S, M)``, from ``[0 | I | 0]`` and
``[0 | 0 | I]``, gives the ``[2K, 2K]`` block transition ``(S_in, M_in) -> (S_out, M_out)``; the pair
is chained as one ``[2K, V]`` state. Two passes, the first ``(V + 2K) / V`` as wide.

Both backwards are autodiff of this program (the kernels are differentiable in their initial state,
and the scan's ``ppermute`` transposes to the reverse shift). Communication per layer and direction:
ceil(log2 C) rounds each moving one float32 state ``[B, H, K, V]`` (``[B, H, 2K, V]`` for the momentum
pair) and one transition (``[B, H, K, K]`` for the delta rule, ``[B, H, 2K, 2K]`` for the momentum pair,
``[B, H, K]`` or ``[B, H]`` for the diagonal ones), then one more state shift. Documents that start inside a shard cut the chain through their reset log
decay (``seqmodels.layers.segments``), as on one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import chunk_gla, gated_delta_rule
from pallas_kernels.linear_scan import linear_scan
from seqmodels.layers.context import context_map, diagonal_apply, incoming_states, matrix_apply
from seqmodels.sharding import sequence_shards

SEQUENCE = ("batch", "seq", "heads", None)
GATES = ("batch", "seq", "heads")
STATE = ("batch", "heads", None, None)


def split_chunk_gla(q, k, v, log_decay, *, scale: float, chunk_size: int, impl: str):
    """``chunk_gla`` outputs ``o [B, T, H, V]`` for a sequence split over ``context`` (module docstring)."""
    shards = sequence_shards()

    def local(q, k, v, log_decay):
        o, final = chunk_gla(q, k, v, log_decay, scale=scale, chunk_size=chunk_size, impl=impl,
                             output_final_state=True)
        cumulative = jnp.cumsum(log_decay.astype(jnp.float32), axis=1)  # [B, T, H] or [B, T, H, K]
        per_key = cumulative if log_decay.ndim == 4 else cumulative[..., None]
        transition = jnp.exp(per_key[:, -1])[..., None]  # [B, H, K or 1, 1]
        incoming = incoming_states(transition, final, shards, diagonal_apply)
        decayed_q = q.astype(jnp.float32) * jnp.exp(per_key)
        correction = scale * jnp.einsum("bthk,bhkv->bthv", decayed_q, incoming)
        return (o.astype(jnp.float32) + correction).astype(o.dtype)

    decay_names = GATES if log_decay.ndim == 3 else SEQUENCE
    return context_map(local, (q, k, v, log_decay), (SEQUENCE, SEQUENCE, SEQUENCE, decay_names), SEQUENCE)


def _through_states(run, values, key_dim: int, num_states: int, shards: int):
    """Outputs of ``run(values, starts) -> (o, finals)`` for one shard of a split sequence.

    ``run`` is a recurrence over ``num_states`` coupled ``[B, H, K, V]`` states (a tuple ``starts`` in, a
    tuple ``finals`` out), linear in (states, values) and acting on each value column alone. One pass
    over the values widened by ``num_states * K`` zero columns, from the starts ``[0 | e_i x I_K]``,
    returns every final's share from zero (the first V columns) and from each start (the others); the
    scan gives the incoming states and a second pass from them the outputs (module docstring).
    """
    batch, _, heads, value_dim = values.shape
    eye = jnp.broadcast_to(jnp.eye(num_states * key_dim, dtype=jnp.float32),
                           (batch, heads, num_states * key_dim, num_states * key_dim))
    zero_start = jnp.zeros((batch, heads, key_dim, value_dim), jnp.float32)
    starts = tuple(jnp.concatenate([zero_start, eye[:, :, i * key_dim:(i + 1) * key_dim]], axis=-1)
                   for i in range(num_states))
    widened = jnp.concatenate([values, jnp.zeros(values.shape[:3] + (num_states * key_dim,), values.dtype)], -1)
    _, ends = run(widened, starts)
    ends = jnp.concatenate(ends, axis=2)  # [B, H, n K, V + n K]: rows are the stacked final states
    stacked = incoming_states(ends[..., value_dim:], ends[..., :value_dim], shards, matrix_apply)
    incoming = tuple(stacked[:, :, i * key_dim:(i + 1) * key_dim] for i in range(num_states))
    return run(values, incoming)[0]


def split_gated_delta_rule(q, k, v, beta, log_decay, *, scale: float | None, chunk_size: int, impl: str):
    """``gated_delta_rule`` outputs ``o [B, T, H, V]`` for a sequence split over ``context`` (module docstring)."""
    shards = sequence_shards()

    def local(q, k, v, beta, log_decay):
        def run(values, starts):
            o, final = gated_delta_rule(q, k, values, beta, log_decay, scale=scale, chunk_size=chunk_size,
                                        impl=impl, initial_state=starts[0], output_final_state=True)
            return o, (final,)
        return _through_states(run, v, k.shape[-1], 1, shards)

    decay = None if log_decay is None else GATES
    return context_map(local, (q, k, v, beta, log_decay), (SEQUENCE, SEQUENCE, SEQUENCE, GATES, decay), SEQUENCE)


def split_momentum_scan(scan, q, k, values, gates, *, scale: float, chunk_size: int, impl: str):
    """A ``pallas_kernels.momentum_scan`` op's outputs for a sequence split over ``context``.

    ``scan(q, k, values, *gates, scale=, chunk_size=, impl=, initial_state=, initial_momentum=)`` is
    ``momentum_scalar_decay`` (gates: log decay, log momentum decay) or ``momentum_delta_rule`` (beta,
    log decay, log momentum decay). The state ``S`` and momentum ``M`` pass together: the shard's
    transition is the ``[2K, 2K]`` block matrix of ``(S_in, M_in) -> (S_out, M_out)``.
    """
    shards = sequence_shards()

    def local(q, k, values, *gates):
        def run(widened, starts):
            o, state, momentum = scan(q, k, widened, *gates, scale=scale, chunk_size=chunk_size, impl=impl,
                                      initial_state=starts[0], initial_momentum=starts[1])
            return o, (state, momentum)
        return _through_states(run, values, k.shape[-1], 2, shards)

    return context_map(local, (q, k, values, *gates), (SEQUENCE, SEQUENCE, SEQUENCE) + (GATES,) * len(gates),
                       SEQUENCE)


def split_linear_scan(a, b, *, impl: str):
    """``linear_scan`` states ``h [B, T, D, N]`` (``h_t = a_t * h_{t-1} + b_t``) for a sequence split over
    ``context``: the shard's scan from zero plus ``prod_{s <= t} a_s * h_in`` (a diagonal transition)."""
    shards = sequence_shards()

    def local(a, b):
        states = linear_scan(a, b, impl=impl)
        # prod_{s <= t} a_s as the scan of a from ones (a cumulative product here crashes XLA's CPU compiler
        # in the backward inside shard_map, jax 0.11.2)
        carried = linear_scan(a, jnp.zeros_like(a), initial=jnp.ones_like(a[:, 0]), impl=impl).astype(jnp.float32)
        incoming = incoming_states(carried[:, -1], states[:, -1], shards, diagonal_apply)
        return (states.astype(jnp.float32) + carried * incoming[:, None]).astype(states.dtype)

    names = ("batch", "seq", "heads", None)
    return context_map(local, (a, b), (names, names), names)
