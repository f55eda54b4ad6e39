"""MuonSSM on Gated DeltaNet, Mamba2 and LongHorn in PyTorch: the JAX ``seqmodels.mixers.muonssm``.

Each backbone's injection U_t goes through a momentum of conditioned injections::

    M_t = gamma M_{t-1} + tau NS_k(U_t),  S_t = A_t(S_{t-1}) + M_t       (NS_k(U) = r_k U: rank 1)

with ns_scope all: one normalisation over every head (mamba2 / longhorn: the shared key, gated_deltanet:
the block-diagonal injection), head: each head (longhorn: each group) alone. The cache holds the
backbone's and the momentum's state; a padded step leaves both unchanged (the momentum does not decay).
Calls of more than one token run the chunk form of both scans (Gated DeltaNet and Mamba2:
``chunked.chunk_momentum``; LongHorn, whose decay is per state entry: ``chunked.chunk_diagonal_scan`` over the
velocity, then over the state), one decoded token the recurrent step.
"""

from __future__ import annotations

import math

import torch

from .chunked import chunk_diagonal_scan, chunk_momentum
from .deltanet import DeltaNet
from .longhorn import LongHorn
from .mamba2 import Mamba2
from .newton_schulz import block_rank_one_scale, rank_one_scale
from .recurrences import cached_state, keep_real


class _Momentum:
    """MuonSSM settings and the conditioned-injection scale shared by the backbones."""

    def _set_momentum(self, model: dict):
        settings = model["muonssm"]
        self.gamma, self.tau, self.ns_scope = settings["gamma"], settings["tau"], settings["ns_scope"]
        self.ns = dict(steps=settings["ns_steps"], coefficients=settings["ns_coefficients"], eps=settings["ns_eps"])

    def injection_scale(self, sum_squares: torch.Tensor, *, shared_key: bool) -> torch.Tensor:
        """``tau r_k`` per token and head from each head's ``||U_h||_F^2 [B, T, H]``."""
        if self.ns_scope == "head":
            return self.tau * rank_one_scale(sum_squares, **self.ns)
        if shared_key:
            total = sum_squares.sum(-1, keepdim=True)
            return self.tau * rank_one_scale(total, **self.ns).expand_as(sum_squares)
        return self.tau * block_rank_one_scale(sum_squares, **self.ns)


class MuonSSMGatedDeltaNet(_Momentum, DeltaNet):
    def __init__(self, model: dict):
        DeltaNet.__init__(self, model, gated=True)
        self._set_momentum(model)

    def recurrence(self, q, k, v, beta, log_decay, cache, valid):
        sum_squares = beta.square() * k.square().sum(-1) * v.square().sum(-1)
        scale = self.injection_scale(sum_squares, shared_key=False)
        if self.gamma == 0:
            return DeltaNet.recurrence(self, q, k, scale[..., None] * v, beta, log_decay, cache, valid)
        w = (scale * beta)[..., None] * v
        shape = (q.shape[0], self.heads, self.key_dim, self.value_dim)
        state, momentum = (cached_state(cache, name, shape, q.device) for name in ("state", "momentum"))
        decay_of_momentum, outputs = math.exp(math.log(self.gamma)), []
        if self.chunked(q.shape[1]):
            o, state, momentum = chunk_momentum(q, k, w, beta, log_decay, math.log(self.gamma), state, momentum, valid,
                                                chunk_size=self.chunk_size)
            if cache is not None:
                cache.update(state=state, momentum=momentum)
            return o
        for t in range(q.shape[1]):
            new_momentum = decay_of_momentum * momentum + k[:, t, :, :, None] * w[:, t, :, None, :]
            decayed = torch.exp(log_decay[:, t])[..., None, None] * state
            predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], decayed)
            new = decayed - beta[:, t, :, None, None] * k[:, t, :, :, None] * predicted[:, :, None, :] + new_momentum
            state, momentum = keep_real(valid, t, new, state), keep_real(valid, t, new_momentum, momentum)
            outputs.append(self.key_dim ** -0.5 * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
        if cache is not None:
            cache.update(state=state, momentum=momentum)
        return torch.stack(outputs, dim=1)


class MuonSSMMamba2(_Momentum, Mamba2):
    def __init__(self, model: dict):
        Mamba2.__init__(self, model)
        self._set_momentum(model)
        self.find_kernels("simple_gla")  # mamba_ssm's SSD has no momentum: fla's simple GLA serves gamma = 0 only

    def recurrence(self, q, k, v, log_decay, cache, valid):
        sum_squares = k.square().sum(-1, keepdim=True) * v.square().sum(-1)  # [B, T, H]
        v = self.injection_scale(sum_squares, shared_key=True)[..., None] * v
        if self.gamma == 0:
            return Mamba2.recurrence(self, q, k, v, log_decay, cache, valid)
        (state, momentum), outputs = self._states(cache, ("state", "momentum"), q), []
        decay_of_momentum = math.exp(math.log(self.gamma))
        if self.chunked(q.shape[1]):
            shared = (q.shape[0], q.shape[1], self.heads, self.state_dim)
            y, state, momentum = chunk_momentum(q[:, :, None].expand(shared), k[:, :, None].expand(shared), v, None,
                                                log_decay, math.log(self.gamma), state, momentum, valid,
                                                chunk_size=self.chunk_size, scale=1.0)
            if cache is not None:
                cache.update(state=state, momentum=momentum)
            return y
        for t in range(q.shape[1]):
            new_momentum = decay_of_momentum * momentum + k[:, t, None, :, None] * v[:, t, :, None, :]
            new = torch.exp(log_decay[:, t])[..., None, None] * state + new_momentum
            state, momentum = keep_real(valid, t, new, state), keep_real(valid, t, new_momentum, momentum)
            outputs.append(torch.einsum("bn,bhnp->bhp", q[:, t], state))
        if cache is not None:
            cache.update(state=state, momentum=momentum)
        return torch.stack(outputs, dim=1)


class MuonSSMLongHorn(LongHorn):
    def __init__(self, model: dict):
        super().__init__(model)
        settings = model["muonssm"]
        self.gamma, self.tau = settings["gamma"], settings["tau"]
        self.ns = dict(steps=settings["ns_steps"], coefficients=settings["ns_coefficients"], eps=settings["ns_eps"])
        self.groups = 1 if settings["ns_scope"] == "all" else model["num_heads"]

    def recurrence(self, keep, written, k, cache, valid):
        grouped = written.reshape(*written.shape[:2], self.groups, -1)
        sum_squares = grouped.square().sum(-1) * k.square().sum(-1, keepdim=True)
        scale = self.tau * rank_one_scale(sum_squares, **self.ns)
        written = scale.repeat_interleave(self.channels // self.groups, dim=-1) * written
        if self.gamma == 0:
            return LongHorn.recurrence(self, keep, written, k, cache, valid)
        shape = (keep.shape[0], self.channels, self.state_dim)
        state, velocity = (cached_state(cache, name, shape, keep.device) for name in ("state", "velocity"))
        if self.chunked(keep.shape[1]):
            injection = written[..., None] * k[:, :, None, :]
            velocities, velocity = chunk_diagonal_scan(torch.tensor(self.gamma, device=keep.device), injection,
                                                       velocity, valid, chunk_size=self.chunk_size)
            states, state = chunk_diagonal_scan(keep, velocities, state, valid, chunk_size=self.chunk_size)
            if cache is not None:
                cache.update(state=state, velocity=velocity)
            return states
        states = []
        for t in range(keep.shape[1]):
            new_velocity = self.gamma * velocity + written[:, t, :, None] * k[:, t, None, :]
            state = keep_real(valid, t, keep[:, t] * state + new_velocity, state)
            velocity = keep_real(valid, t, new_velocity, velocity)
            states.append(state)
        if cache is not None:
            cache.update(state=state, velocity=velocity)
        return torch.stack(states, dim=1)


MIXERS = {"muonssm_gated_deltanet": MuonSSMGatedDeltaNet, "muonssm_mamba2": MuonSSMMamba2,
          "muonssm_longhorn": MuonSSMLongHorn}
