"""MuonSSM mixers: a backbone's transition with a momentum pathway over Newton-Schulz-conditioned injections.

A linear-recurrent backbone ``S_t = A_t(S_{t-1}) + U_t`` keeps its transition ``A_t``; its input
injection ``U_t`` is replaced by a momentum over conditioned injections::

    W_t = tau * NS_k(U_t)                    (NS_0 = identity)
    M_t = gamma * M_{t-1} + W_t              (M cut at each document's first token)
    S_t = A_t(S_{t-1}) + M_t,   o_t = S_t^T q_t

with constant ``gamma`` in [0, 1), ``tau > 0`` and ``k >= 0`` Newton-Schulz steps (``model.muonssm``;
defaults 0.9, 1, 1). ``gamma = 0`` and ``k = 0`` (with ``tau = 1``) is the backbone exactly (the
backbone's own kernel then runs). Both backbones inject rank 1 per token and head, ``U_t = k_t u_t^T``, so
``NS_k(U_t) = r_k(||U_t||_F) U_t`` with the scalar of ``momentum.conditioning.rank_one_scale`` (the
closed form of ``pallas_kernels.newton_schulz`` on a rank-1 matrix; one singular value goes through
the k polynomials). So ``W_t = k_t (tau r_k u_t)^T``: the momentum recurrences take rescaled values. The recurrences
and the closed forms are the op ``pallas_kernels.momentum_scan``.

**Scope** (``model.muonssm.ns_scope``). The MuonSSM code (its LongHorn kernel,
``selective_scan_online_orth_fn``) runs Newton-Schulz on one injection per token over *all* channels,
the ``[D, N]`` matrix ``(T_t u_t) k_t^T`` with the key shared by every channel; ``all`` (the default)
follows it. For ``muonssm_mamba2`` (one group: ``B_t`` shared by the heads) that matrix is
``[H P, N]`` and still rank 1, ``||U_t||_F^2 = ||B_t||^2 sum_h Delta_{t,h}^2 ||x_{t,h}||^2``, so every
head takes the same ``r_k``. Gated DeltaNet's heads have their own keys, so its all-heads injection is
the block-diagonal ``diag(U_{t,1}, ..., U_{t,H})``: one Frobenius normalisation over all heads, then
each head's singular value through the polynomials (``block_rank_one_scale``), which keeps every
block rank 1 and the chunked form exact. ``head`` conditions each head's block on its own (the rule
before the scope was an option); with one head both scopes agree.

- ``muonssm_mamba2``: the Mamba2 mixer (``mamba2.py``: same parameters, projections, conv, gate
  and norm) with ``A_t(S) = exp(Delta_t A) S`` per head, ``k_t = B_t``, ``u_t = Delta_t x_t``,
  ``q_t = C_t``, ``||U_t||_F = ||B_t|| |Delta_t| ||x_t||``. Training runs the chunked second-order
  form of ``momentum_scalar_decay`` (within a chunk ``S = e^G S_in + mu M_in + (kappa o QK^T) V``,
  ``kappa = L_G @ L_gamma``; no per-token states).
- ``muonssm_gated_deltanet``: the Gated DeltaNet mixer (``deltanet.py``) with
  ``A_t(S) = exp(g_t)(I - beta_t k_t k_t^T) S``, ``U_t = beta_t k_t v_t^T``,
  ``||U_t||_F = beta_t ||k_t|| ||v_t||``. Training runs the chunked form of
  ``momentum_delta_rule``: the delta rule's UT transform extended by the momentum input (M does not
  depend on S, so a parallel chunk form exists although the transition is not diagonal).

**The repository's Gated DeltaNet rule (a documented departure of that code from the paper).**
Two rules carry the MuonSSM name for Gated DeltaNet:

    paper (here, the default and only rule):  W_t = tau NS_k(U_t),  M_t = gamma M_{t-1} + W_t,  S_t = A_t(S_{t-1}) + M_t
    MuonSSM repository's GDN code:            M_t = gamma M_{t-1} + U_t,  S_t = A_t(S_{t-1}) + tau NS_k(M_t)

The paper's Newton-Schulz acts on one rank-1 injection, so it is a rescaling of ``U_t`` (one
singular value through the k polynomials): the momentum stays a linear recurrence over rescaled
values, with a chunk-parallel form and exact autodiff. The repository's acts on the full-rank
momentum, the sum of all past injections: it pushes every singular value of ``M_t`` towards 1, so
directions written long ago weigh as much as the newest, and ``NS_k(M_t)`` is not linear in the
injections. It must run token by token (one ``[K, V]`` Newton-Schulz per token and head), and that
code back-propagates through it straight-through (as if ``NS_k`` were the identity), so its
gradients are not those of its forward. The two are different models, not two forms of one; this
module implements the paper's (``muonssm_longhorn`` follows the MuonSSM LongHorn kernel, which
conditions each injection too). The repository's sequential rule is not offered.

Decoding runs the token recurrences (``impl="reference"``) one step per token from a cache holding
the backbone's conv inputs, ``state`` and ``momentum`` (``[B, H, K, V]`` float32 each); training runs
the op with ``impl=model.kernel_impl`` (``reference``: the token-by-token oracle). With the sequence
split over ``mesh.context`` the state and the momentum pass between shards together
(``seqmodels.layers.state_passing.split_momentum_scan``).

FLOPs per token (forward): the backbone's projections and convolutions (``mamba2_flops``,
``deltanet_flops``) plus, per head, with ``C`` = min(chunk_size, T):
``muonssm_mamba2``: ``2 C^2 + 2 C + 2 C (N + P) + 8 N P`` (kappa and mu, scores and their product
with v, increments and read-outs of both states); ``muonssm_gated_deltanet``:
``2 C^2 + 2 C + 6 C K + 7 C V + 14 K V`` (kappa and mu, key products, a solve with 2K + V columns,
two [C, C] x [C, V] read-outs, seven [K, V] state products). With ``gamma = 0`` the backbone's formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import jax.numpy as jnp

from pallas_kernels.momentum_scan import (block_rank_one_scale, momentum_delta_rule, momentum_scalar_decay,
                                          rank_one_scale)

from seqmodels.config_base import NsCoefficients, _require, _require_choices, describe
from seqmodels.layers.context import sequence_is_split
from seqmodels.layers.segments import reset_at_document_starts
from seqmodels.layers.state_passing import split_momentum_scan
from seqmodels.mixers.deltanet import DeltaNet, deltanet_flops
from seqmodels.mixers.mamba2 import Mamba2, mamba2_flops
from seqmodels.mixers.registry import register, register_section


@dataclass(frozen=True)
class MuonSSMConfig:
    """MuonSSM: momentum over Newton-Schulz-conditioned injections, ``M_t = gamma M_{t-1} + tau NS_k(U_t)``."""

    gamma: float = describe("momentum decay gamma in [0, 1); 0 = no momentum", 0.9)
    tau: float = describe("scale tau > 0 of the conditioned injection", 1.0)
    ns_steps: int = describe("k: Newton-Schulz steps on each injection U_t; 0 = U_t unchanged", 1)
    ns_coefficients: NsCoefficients = describe("Newton-Schulz polynomial schedule", "muon")
    ns_eps: float = describe("epsilon of the Newton-Schulz input normalisation U / (||U||_F + eps)", 1e-7)
    ns_scope: Literal["all", "head"] = describe(
        "the matrix Newton-Schulz conditions per token: all (the MuonSSM code: one injection over every channel, "
        "[D, N] with the key shared by all heads in mamba2 / longhorn, block-diagonal over heads in "
        "gated_deltanet) | head (each head's [N, P] block on its own)", "all")

    def __post_init__(self):
        _require_choices(self, "model.muonssm")
        _require(0.0 <= self.gamma < 1.0, "model.muonssm.gamma", f"must be in [0, 1), got {self.gamma}")
        _require(self.tau > 0, "model.muonssm.tau", f"must be > 0, got {self.tau}")
        _require(self.ns_steps >= 0, "model.muonssm.ns_steps", f"k must be >= 0, got {self.ns_steps}")
        _require(self.ns_eps > 0, "model.muonssm.ns_eps", f"must be > 0, got {self.ns_eps}")


register_section("muonssm", MuonSSMConfig, "MuonSSM settings (muonssm_* mixers)")


class _Momentum:
    """The MuonSSM pathway shared by both backbones (a mixin over ``Mamba2`` / ``DeltaNet``)."""

    def _set_momentum(self, config):
        settings = config.muonssm
        self.gamma, self.tau, self.ns_steps = settings.gamma, settings.tau, settings.ns_steps
        self.ns_coefficients, self.ns_eps = settings.ns_coefficients, settings.ns_eps
        self.ns_scope = settings.ns_scope

    def injection_scale(self, sum_squares, *, shared_key: bool):
        """``tau r_k`` per token and head from each head's ``||U_{t,h}||_F^2`` (``[B, T, H]``): ``W_t = scale_t U_t``.

        ``ns_scope = all`` conditions the all-heads injection: rank 1 over ``[H P, N]`` when the heads
        share their key (``shared_key``), block-diagonal otherwise (module docstring).
        """
        ns = dict(steps=self.ns_steps, coefficients=self.ns_coefficients, eps=self.ns_eps)
        if self.ns_scope == "head":
            return self.tau * rank_one_scale(sum_squares, **ns)
        if shared_key:
            total = jnp.sum(sum_squares, axis=-1, keepdims=True)
            return self.tau * jnp.broadcast_to(rank_one_scale(total, **ns), sum_squares.shape)
        return self.tau * block_rank_one_scale(sum_squares, axis=-1, **ns)

    def log_momentum_decay(self, shape, segment_ids):
        """``log gamma`` per token and head, -30 at document starts: float32 ``[B, T, H]``."""
        return reset_at_document_starts(jnp.full(shape, math.log(self.gamma), jnp.float32), segment_ids)

    def run_momentum(self, scan, inputs, *, scale, segment_ids, cache):
        """``(o, cache entries or None)`` of the momentum ``scan``; decoding one token runs its token recurrence."""
        log_momentum = self.log_momentum_decay(inputs[0].shape[:3], segment_ids)
        if cache is None and sequence_is_split(inputs[0].shape[1]):
            o = split_momentum_scan(scan, *inputs[:3], (*inputs[3:], log_momentum), scale=scale,
                                    chunk_size=self.chunk_size, impl=self.impl)
            return o, None
        states = {} if cache is None else {"initial_state": cache["state"], "initial_momentum": cache["momentum"]}
        one_step = cache is not None and inputs[0].shape[1] == 1
        impl = "reference" if one_step else self.impl
        o, state, momentum = scan(*inputs, log_momentum, scale=scale, chunk_size=self.chunk_size, impl=impl, **states)
        return o, (None if cache is None else {"state": state, "momentum": momentum})

    def add_momentum_cache(self, cache: dict) -> dict:
        if self.gamma == 0:
            return cache
        return {**cache, "momentum": jnp.zeros_like(cache["state"])}


def _sum_squares(x):
    return jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1)


class MuonSSMMamba2(_Momentum, Mamba2):
    """Mamba2 with the MuonSSM momentum pathway (module docstring)."""

    def __init__(self, config, *, rngs):
        Mamba2.__init__(self, config, rngs=rngs)
        self._set_momentum(config)

    def recurrence(self, q, k, v, log_decay, *, segment_ids, cache):
        scale = self.injection_scale(_sum_squares(k) * _sum_squares(v), shared_key=True)
        v = (scale[..., None] * v.astype(jnp.float32)).astype(v.dtype)
        if self.gamma == 0:
            return Mamba2.recurrence(self, q, k, v, log_decay, segment_ids=segment_ids, cache=cache)
        return self.run_momentum(momentum_scalar_decay, (q, k, v, log_decay),
                                 scale=1.0, segment_ids=segment_ids, cache=cache)

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        return self.add_momentum_cache(Mamba2.init_cache(self, batch_size, max_len, dtype))


class MuonSSMGatedDeltaNet(_Momentum, DeltaNet):
    """Gated DeltaNet with the MuonSSM momentum pathway (module docstring)."""

    def __init__(self, config, *, rngs):
        DeltaNet.__init__(self, config, gated=True, rngs=rngs)
        self._set_momentum(config)

    def recurrence(self, q, k, v, beta, log_decay, *, segment_ids, cache):
        sum_squares = jnp.square(beta) * _sum_squares(k) * _sum_squares(v)
        scale = self.injection_scale(sum_squares, shared_key=False)
        if self.gamma == 0:  # W_t = beta_t k_t (scale_t v_t)^T: the kernel's own injection
            v = (scale[..., None] * v.astype(jnp.float32)).astype(v.dtype)
            return DeltaNet.recurrence(self, q, k, v, beta, log_decay, segment_ids=segment_ids, cache=cache)
        w = (scale * beta)[..., None] * v.astype(jnp.float32)
        return self.run_momentum(momentum_delta_rule, (q, k, w, beta, log_decay),
                                 scale=self.key_dim ** -0.5, segment_ids=segment_ids, cache=cache)

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> dict:
        return self.add_momentum_cache(DeltaNet.init_cache(self, batch_size, max_len, dtype))


def _momentum_ssd_flops(chunk: int, state_dim: int, head_dim: int) -> float:
    return 2 * chunk**2 + 2 * chunk + 2 * chunk * (state_dim + head_dim) + 8 * state_dim * head_dim


def _momentum_delta_flops(chunk: int, key_dim: int, value_dim: int) -> float:
    return 2 * chunk**2 + 2 * chunk + 6 * chunk * key_dim + 7 * chunk * value_dim + 14 * key_dim * value_dim


def _muonssm_mamba2_flops(config, seq_len: int) -> float:
    core = None if config.muonssm.gamma == 0 else _momentum_ssd_flops
    return mamba2_flops(config, seq_len, core_per_head=core)


def _muonssm_deltanet_flops(config, seq_len: int) -> float:
    core = None if config.muonssm.gamma == 0 else _momentum_delta_flops
    return deltanet_flops(config, seq_len, gated=True, core_per_head=core)


register("muonssm_mamba2", lambda config, rngs: MuonSSMMamba2(config, rngs=rngs), _muonssm_mamba2_flops,
         sections=("mamba2", "muonssm"), context_parallel=True)
register("muonssm_gated_deltanet", lambda config, rngs: MuonSSMGatedDeltaNet(config, rngs=rngs),
         _muonssm_deltanet_flops, sections=("deltanet", "muonssm"), context_parallel=True)
