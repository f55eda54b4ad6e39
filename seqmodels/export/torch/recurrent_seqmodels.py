"""Linear-recurrent mixers in PyTorch, in their recurrent form (one state update per token, float32 state).

The JAX mixers ``seqmodels.mixers.{deltanet, mamba2, longhorn, muonssm}``; the recurrences are
``pallas_kernels/<op>/reference.py`` written in torch. Per token t (shapes per batch row):

    DeltaNet / Gated DeltaNet (heads H, key K, value V):
        q, k, v = silu(conv(W x)), q, k <- q / ||q||, k / ||k||;  beta = sigmoid(W_beta x)
        g = -exp(A_log) softplus(W_a x + dt_bias)   (gated; 0 for DeltaNet)
        S_t = e^g (I - beta k k^T) S_{t-1} + beta k v^T;  o = K^-1/2 S_t^T q
        out = W_out(RMSNorm(o) * silu(W_g x))                           (per head over V)
    Mamba2 (heads H of P channels, state N; B and C shared by the heads):
        x, B, C = silu(conv(W_x u)), silu(conv(W_B u)), silu(conv(W_C u));  Delta = softplus(W_dt u + dt_bias)
        h_t = exp(Delta A) h_{t-1} + B (Delta x)^T;  y = h_t^T C + D x
        out = W_out RMSNorm(y * silu(z))    (after_gate, all H P channels)  or  RMSNorm(y) * silu(z) per head
    LongHorn (channels D, state N per channel):
        u = silu(conv(W_u x)), k, q = W_k u, W_q u;  dt = sigmoid(W_up W_down u + t_bias);  T = dt / (1 + dt ||k||^2)
        h_t = (1 - T k^2) * h_{t-1} + (T u) k^T;  y = h_t q + D_skip u;  out = W_out(y * silu(z))
    MuonSSM on either: the injection U_t through a momentum of conditioned injections,
        M_t = gamma M_{t-1} + tau NS_k(U_t),  S_t = A_t(S_{t-1}) + M_t       (NS_k(U) = r_k U: rank 1)
        with ns_scope all: one normalisation over every head (mamba2 / longhorn: the shared key,
        gated_deltanet: the block-diagonal injection), head: each head (longhorn: each group) alone.

The cache dict holds the convolutions' last inputs and the states; a fresh (empty) dict starts a row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .layers_seqmodels import RMSNorm, ShortConv, l2_normalize, step_and_log_decay
from .newton_schulz_seqmodels import block_rank_one_scale, rank_one_scale


def _conv(conv: ShortConv, x: torch.Tensor, cache: dict | None, name: str) -> torch.Tensor:
    y, history = conv(x, None if cache is None else cache.get(name))
    if cache is not None:
        cache[name] = history
    return y


def _state(cache: dict | None, name: str, shape, device) -> torch.Tensor:
    if cache is not None and name in cache:
        return cache[name]
    return torch.zeros(shape, dtype=torch.float32, device=device)


def delta_rule_scan(q, k, v, beta, log_decay, state):
    """``(o [B, T, H, V], final state)``: per token ``S = e^g S; S += k (beta (v - S^T k))^T; o = K^-1/2 S^T q``
    (``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``beta, log_decay [B, T, H]``, ``state [B, H, K, V]`` float32)."""
    scale, outputs = q.shape[-1] ** -0.5, []
    for t in range(q.shape[1]):
        state = torch.exp(log_decay[:, t])[..., None, None] * state
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        update = beta[:, t, :, None] * (v[:, t] - predicted)
        state = state + k[:, t, :, :, None] * update[:, :, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state


def gated_linear_scan(q, k, v, log_decay, state):
    """``(o [B, T, H, V], final state)``: per token ``S = e^g S + k v^T; o = K^-1/2 S^T q`` (shapes as
    ``delta_rule_scan``)."""
    scale, outputs = q.shape[-1] ** -0.5, []
    for t in range(q.shape[1]):
        state = torch.exp(log_decay[:, t])[..., None, None] * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state


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


class DeltaNet(nn.Module):
    def __init__(self, model: dict, *, gated: bool):
        super().__init__()
        settings, width = model["deltanet"], model["d_model"]
        heads = model["num_heads"]
        key_dim = settings["head_dim"] or width // heads
        value_dim = settings["value_head_dim"] or key_dim
        self.heads, self.key_dim, self.value_dim, self.gated = heads, key_dim, value_dim, gated
        self.query = nn.Linear(width, heads * key_dim, bias=False)
        self.key = nn.Linear(width, heads * key_dim, bias=False)
        self.value = nn.Linear(width, heads * value_dim, bias=False)
        self.beta_proj = nn.Linear(width, heads, bias=False)
        self.gate = nn.Linear(width, heads * value_dim, bias=False)
        kernel = settings["conv_kernel"]
        self.q_conv, self.k_conv = ShortConv(heads * key_dim, kernel), ShortConv(heads * key_dim, kernel)
        self.v_conv = ShortConv(heads * value_dim, kernel)
        if gated:
            self.decay_proj = nn.Linear(width, heads, bias=False)
            self.a_log = nn.Parameter(torch.zeros(heads))
            self.dt_bias = nn.Parameter(torch.zeros(heads))
        self.norm = RMSNorm(value_dim, model["norm_eps"])
        self.out = nn.Linear(heads * value_dim, width, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        del positions  # a recurrence
        batch, length = x.shape[:2]
        shape = (batch, length, self.heads, -1)
        q = F.silu(_conv(self.q_conv, self.query(x), cache, "conv_q")).reshape(shape)
        k = F.silu(_conv(self.k_conv, self.key(x), cache, "conv_k")).reshape(shape)
        v = F.silu(_conv(self.v_conv, self.value(x), cache, "conv_v")).reshape(shape).float()
        q, k = l2_normalize(q), l2_normalize(k)
        beta = torch.sigmoid(self.beta_proj(x).float())
        if self.gated:
            log_decay = step_and_log_decay(self.decay_proj(x), self.dt_bias, self.a_log)[1]
        else:
            log_decay = torch.zeros_like(beta)
        o = self.recurrence(q, k, v, beta, log_decay, cache)
        o = self.norm(o.to(x.dtype), gate=self.gate(x).reshape(shape))
        return self.out(o.reshape(batch, length, -1)), cache

    def recurrence(self, q, k, v, beta, log_decay, cache):
        """``o [B, T, H, V]`` of ``delta_rule_scan`` from the cached state."""
        state = _state(cache, "state", (q.shape[0], self.heads, self.key_dim, self.value_dim), q.device)
        o, state = delta_rule_scan(q, k, v, beta, log_decay, state)
        if cache is not None:
            cache["state"] = state
        return o


class MuonSSMGatedDeltaNet(_Momentum, DeltaNet):
    def __init__(self, model: dict):
        DeltaNet.__init__(self, model, gated=True)
        self._set_momentum(model)

    def recurrence(self, q, k, v, beta, log_decay, cache):
        sum_squares = beta.square() * k.square().sum(-1) * v.square().sum(-1)
        scale = self.injection_scale(sum_squares, shared_key=False)
        if self.gamma == 0:
            return DeltaNet.recurrence(self, q, k, scale[..., None] * v, beta, log_decay, cache)
        w = (scale * beta)[..., None] * v
        shape = (q.shape[0], self.heads, self.key_dim, self.value_dim)
        state, momentum = _state(cache, "state", shape, q.device), _state(cache, "momentum", shape, q.device)
        decay_of_momentum, outputs = math.exp(math.log(self.gamma)), []
        for t in range(q.shape[1]):
            momentum = decay_of_momentum * momentum + k[:, t, :, :, None] * w[:, t, :, None, :]
            state = torch.exp(log_decay[:, t])[..., None, None] * state
            predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
            state = state - beta[:, t, :, None, None] * k[:, t, :, :, None] * predicted[:, :, None, :] + momentum
            outputs.append(self.key_dim ** -0.5 * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
        if cache is not None:
            cache.update(state=state, momentum=momentum)
        return torch.stack(outputs, dim=1)


class Mamba2(nn.Module):
    def __init__(self, model: dict):
        super().__init__()
        settings, width = model["mamba2"], model["d_model"]
        inner = settings["expand"] * width
        head_dim = settings["head_dim"] or inner // model["num_heads"]
        heads, state_dim = inner // head_dim, settings["state_dim"]
        self.heads, self.head_dim, self.state_dim = heads, head_dim, state_dim
        self.gate = nn.Linear(width, heads * head_dim, bias=False)
        self.x_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.b_proj = nn.Linear(width, state_dim, bias=False)
        self.c_proj = nn.Linear(width, state_dim, bias=False)
        self.dt_proj = nn.Linear(width, heads, bias=False)
        kernel = settings["conv_kernel"]
        self.x_conv = ShortConv(heads * head_dim, kernel)
        self.b_conv, self.c_conv = ShortConv(state_dim, kernel), ShortConv(state_dim, kernel)
        self.a_log, self.dt_bias = nn.Parameter(torch.zeros(heads)), nn.Parameter(torch.zeros(heads))
        self.skip = nn.Parameter(torch.ones(heads))
        self.norm_after_gate = settings["gated_norm"] == "after_gate"
        self.norm = RMSNorm(heads * head_dim if self.norm_after_gate else head_dim, model["norm_eps"])
        self.out = nn.Linear(heads * head_dim, width, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        del positions  # a recurrence
        batch, length = x.shape[:2]
        ssm_input = F.silu(_conv(self.x_conv, self.x_proj(x), cache, "conv_x"))
        ssm_input = ssm_input.reshape(batch, length, self.heads, self.head_dim).float()
        b = F.silu(_conv(self.b_conv, self.b_proj(x), cache, "conv_b")).float()
        c = F.silu(_conv(self.c_conv, self.c_proj(x), cache, "conv_c")).float()
        delta, log_decay = step_and_log_decay(self.dt_proj(x), self.dt_bias, self.a_log)
        v = delta[..., None] * ssm_input
        y = self.recurrence(c, b, v, log_decay, cache)
        y = y + self.skip.float()[:, None] * ssm_input
        gate = self.gate(x).reshape(batch, length, self.heads, self.head_dim)
        if self.norm_after_gate:
            y = self.norm((y * F.silu(gate.float())).reshape(batch, length, -1))
        else:
            y = self.norm(y, gate=gate).reshape(batch, length, -1)
        return self.out(y.to(x.dtype)), cache

    def _states(self, cache, names, q):
        shape = (q.shape[0], self.heads, self.state_dim, self.head_dim)
        return [_state(cache, name, shape, q.device) for name in names]

    def recurrence(self, q, k, v, log_decay, cache):
        """``y [B, T, H, P]``: ``h = e^g h + k v^T; y = h^T q`` per token (q = C, k = B shared by the heads)."""
        (state,), outputs = self._states(cache, ("state",), q), []
        for t in range(q.shape[1]):
            state = torch.exp(log_decay[:, t])[..., None, None] * state + k[:, t, None, :, None] * v[:, t, :, None, :]
            outputs.append(torch.einsum("bn,bhnp->bhp", q[:, t], state))
        if cache is not None:
            cache["state"] = state
        return torch.stack(outputs, dim=1)


class MuonSSMMamba2(_Momentum, Mamba2):
    def __init__(self, model: dict):
        Mamba2.__init__(self, model)
        self._set_momentum(model)

    def recurrence(self, q, k, v, log_decay, cache):
        sum_squares = k.square().sum(-1, keepdim=True) * v.square().sum(-1)  # [B, T, H]
        v = self.injection_scale(sum_squares, shared_key=True)[..., None] * v
        if self.gamma == 0:
            return Mamba2.recurrence(self, q, k, v, log_decay, cache)
        (state, momentum), outputs = self._states(cache, ("state", "momentum"), q), []
        decay_of_momentum = math.exp(math.log(self.gamma))
        for t in range(q.shape[1]):
            momentum = decay_of_momentum * momentum + k[:, t, None, :, None] * v[:, t, :, None, :]
            state = torch.exp(log_decay[:, t])[..., None, None] * state + momentum
            outputs.append(torch.einsum("bn,bhnp->bhp", q[:, t], state))
        if cache is not None:
            cache.update(state=state, momentum=momentum)
        return torch.stack(outputs, dim=1)


class LongHorn(nn.Module):
    def __init__(self, model: dict):
        super().__init__()
        settings, width = model["longhorn"], model["d_model"]
        channels, state_dim = settings["expand"] * width, settings["state_dim"]
        rank = settings["dt_rank"] or math.ceil(width / 16)
        self.channels, self.state_dim = channels, state_dim
        self.in_proj = nn.Linear(width, 2 * channels, bias=False)
        self.conv = ShortConv(channels, settings["conv_kernel"])
        self.kq_proj = nn.Linear(channels, 2 * state_dim, bias=False)
        self.dt_down = nn.Linear(channels, rank, bias=False)
        self.dt_up = nn.Linear(rank, channels, bias=False)
        self.t_bias = nn.Parameter(torch.zeros(channels))
        self.skip = nn.Parameter(torch.ones(channels))
        self.out = nn.Linear(channels, width, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        del positions  # a recurrence
        u, z = self.in_proj(x).split(self.channels, dim=-1)
        u = F.silu(_conv(self.conv, u, cache, "conv"))
        k, q = self.kq_proj(u).float().split(self.state_dim, dim=-1)
        dt = torch.sigmoid(self.dt_up(self.dt_down(u)).float() + self.t_bias.float())
        step = dt / (1.0 + dt * k.square().sum(-1, keepdim=True))  # [B, T, D]
        keep = 1.0 - step[..., None] * k.square()[:, :, None, :]  # [B, T, D, N]
        written = step * u.float()
        states = self.recurrence(keep, written, k, cache)
        y = torch.einsum("btdn,btn->btd", states, q) + self.skip.float() * u.float()
        return self.out((y * F.silu(z.float())).to(x.dtype)), cache

    def recurrence(self, keep, written, k, cache):
        """``h [B, T, D, N]``: ``h_t = keep_t * h_{t-1} + written_t k_t^T``."""
        state = _state(cache, "state", (keep.shape[0], self.channels, self.state_dim), keep.device)
        states = []
        for t in range(keep.shape[1]):
            state = keep[:, t] * state + written[:, t, :, None] * k[:, t, None, :]
            states.append(state)
        if cache is not None:
            cache["state"] = state
        return torch.stack(states, dim=1)


class MuonSSMLongHorn(LongHorn):
    def __init__(self, model: dict):
        super().__init__(model)
        settings = model["muonssm"]
        self.gamma, self.tau = settings["gamma"], settings["tau"]
        self.ns = dict(steps=settings["ns_steps"], coefficients=settings["ns_coefficients"], eps=settings["ns_eps"])
        self.groups = 1 if settings["ns_scope"] == "all" else model["num_heads"]

    def recurrence(self, keep, written, k, cache):
        grouped = written.reshape(*written.shape[:2], self.groups, -1)
        sum_squares = grouped.square().sum(-1) * k.square().sum(-1, keepdim=True)
        scale = self.tau * rank_one_scale(sum_squares, **self.ns)
        written = scale.repeat_interleave(self.channels // self.groups, dim=-1) * written
        if self.gamma == 0:
            return LongHorn.recurrence(self, keep, written, k, cache)
        shape = (keep.shape[0], self.channels, self.state_dim)
        state, velocity = _state(cache, "state", shape, keep.device), _state(cache, "velocity", shape, keep.device)
        states = []
        for t in range(keep.shape[1]):
            velocity = self.gamma * velocity + written[:, t, :, None] * k[:, t, None, :]
            state = keep[:, t] * state + velocity
            states.append(state)
        if cache is not None:
            cache.update(state=state, velocity=velocity)
        return torch.stack(states, dim=1)


RECURRENT_MIXERS = {
    "deltanet": lambda model: DeltaNet(model, gated=False),
    "gated_deltanet": lambda model: DeltaNet(model, gated=True),
    "muonssm_gated_deltanet": MuonSSMGatedDeltaNet,
    "mamba2": Mamba2,
    "muonssm_mamba2": MuonSSMMamba2,
    "longhorn": LongHorn,
    "muonssm_longhorn": MuonSSMLongHorn,
}
