"""Atlas (and Titans, OmegaNet) in PyTorch, token by token: the JAX ``seqmodels.mixers.atlas``.

Per head (head dimension D), token by token (``pallas_kernels/atlas_memory/reference.py``'s ``step``)::

    q, k, v = silu(conv(W_qkv x)), q, k <- q / ||q||, k / ||k||;  alpha, theta, eta, gamma = lo + (hi - lo) sigmoid(W x + b)
    base      = M at the first token of the current chunk of b row positions (M before its update)
    G_t       = sum_{i = t-c+1}^{t} gamma_i clip_tau(grad_M ||M(phi(k_i)) - v_i||^2 at base)     (Omega window c)
    S_t       = theta_t S_{t-1} - eta_t G_t,   M_t = alpha_t M_{t-1} + NS_k(S_t)      (eta_scales = gradient)
    S_t       = theta_t S_{t-1} - G_t,         M_t = alpha_t M_{t-1} + eta_t NS_k(S_t)  (eta_scales = update)
    y_t       = W_o concat_h(RMSNorm(M_t(phi(q_t))) * silu(W_g x))

with ``phi`` the polynomial features (degree p: ``[c_1 k, c_2 (k_:R (x) k_:R), ...]``), ``M`` a matrix
``W [F, D]`` or the MLP ``phi[:D] + silu(phi W1) W2`` (with ``model.atlas.memory_norm``: ``phi[:D] + g * LN(o)``,
``o`` the linear or MLP branch, ``g [H, D]`` a learned gain), the gradients in closed form (outer products) and
``NS_k`` applied to the deep memory's ``W1`` and zero-padded ``W2^T`` stacked: the same matrices as the JAX
op's one call per matrix.

Padding (``positions`` -1) is skipped by the convolution and changes nothing of the state: not the memory,
the momentum, the Omega window, nor the row's count of tokens that places its chunk boundaries.

Chunk-parallel form (``scan_form``, as every recurrent twin: a call of more than one token runs it, a decoded
token the step above). Within a chunk of ``b`` row positions every gradient is taken at the one base memory,
so the rule above is, per chunk, with ``g_i = gamma_i clip(grad l(base; k_i, v_i))`` for the chunk's tokens
and the ``c - 1`` before them::

    G = Band g                      Band_ti = 1 for the c tokens i of t's window: one [b, b + c - 1] matmul
    S = L_theta (-s G) + P_theta S_0,   M = L_alpha (u NS_k(S)) + P_alpha M_0,   y_t = M_t(phi(q_t))

with ``L_x[t, j] = prod_{j < r <= t} x_r`` (``j <= t``), ``P_x[t] = prod_{r <= t} x_r``, ``s`` / ``u`` the
step's ``eta`` or 1 (``eta_scales``), and ``NS_k`` run on the chunk's ``b`` momenta at once: only the loop over
chunks is sequential. Each row's real tokens are first packed to the front (padding at the end is a step
that changes nothing: ``theta = alpha = 1``, ``s = u = 0``) and placed at their row position modulo ``b``, so
the chunks of every row line up whatever its padding or the tokens a cache has seen; the Omega window and
the base memory of a chunk already begun come from the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .atlas_memory_constants import NORM_EPS
from .layers import RMSNorm, ShortConv, l2_normalize, real_tokens
from .chunked import ScanForm
from .newton_schulz import newton_schulz

GATES = ("alpha", "theta", "eta", "gamma")


def memory_shapes(model: dict) -> tuple[int, int, int]:
    """``(features F, values D, hidden E)`` of one head's memory (E = 0: linear memory)."""
    atlas, head_dim = model["atlas"], model["d_model"] // model["num_heads"]
    features = head_dim + sum(atlas["poly_key_dim"] ** i for i in range(2, atlas["poly_degree"] + 1))
    hidden = atlas["memory_expansion"] * head_dim if atlas["memory_depth"] == 2 else 0
    return features, head_dim, hidden


def feature_map(keys: torch.Tensor, coefficients: torch.Tensor | None, poly_key_dim: int) -> torch.Tensor:
    """``phi(keys [..., H, K])`` with ``coefficients [H, p]`` (None: identity) -> ``[..., H, F]``."""
    if coefficients is None:
        return keys
    reduced, power = keys[..., :poly_key_dim], keys[..., :poly_key_dim]
    blocks = [coefficients[:, 0:1] * keys]
    for i in range(2, coefficients.shape[-1] + 1):
        power = (power[..., :, None] * reduced[..., None, :]).reshape(*keys.shape[:-1], -1)
        blocks.append(coefficients[:, i - 1:i] * power)
    return torch.cat(blocks, dim=-1)


def _branch(weights, phi):
    """``(o, pre-activation, hidden)``: the memory's branch ``phi W`` or ``silu(phi W1) W2`` (linear: None, None)."""
    if len(weights) == 1:
        return torch.einsum("...m,...mn->...n", phi, weights[0]), None, None
    pre = torch.einsum("...m,...mn->...n", phi, weights[0])
    hidden = F.silu(pre)
    return torch.einsum("...e,...ev->...v", hidden, weights[1]), pre, hidden


def _layer_norm(branch):
    """``(LN(branch), 1 / sqrt(var + eps))`` over the last axis, no gain or bias (``NORM_EPS``)."""
    centred = branch - branch.mean(-1, keepdim=True)
    inverse_std = torch.rsqrt(centred.square().mean(-1, keepdim=True) + NORM_EPS)
    return centred * inverse_std, inverse_std


def memory_apply(weights, phi: torch.Tensor, value_dim: int, gain: torch.Tensor | None = None) -> torch.Tensor:
    """``M(phi)`` for weights ``[..., m, n]`` and ``phi [..., F]`` -> ``[..., D]``; with a gain ``[H, D]`` the
    memory_norm form ``phi[:D] + g * LN(o)``."""
    branch = _branch(weights, phi)[0]
    if gain is not None:
        return phi[..., :value_dim] + gain * _layer_norm(branch)[0]
    return phi[..., :value_dim] + branch if len(weights) == 2 else branch


def gradient_factors(weights, phi, values, value_dim: int, gain: torch.Tensor | None = None):
    """``((left, right), ...)``: ``grad_W l = left (x) right`` per weight matrix (closed form; with a gain the
    LayerNorm's backward ``(u - mean u - n mean(u n)) / sqrt(var + eps)``, ``u = g * 2e``, replaces ``2e``)."""
    branch, pre, hidden = _branch(weights, phi)
    residual = phi[..., :value_dim] if len(weights) == 2 or gain is not None else 0.0
    if gain is not None:
        normed, inverse_std = _layer_norm(branch)
        upstream = gain * 2.0 * (residual + gain * normed - values)
        grad_branch = inverse_std * (upstream - upstream.mean(-1, keepdim=True)
                                     - normed * (upstream * normed).mean(-1, keepdim=True))
    else:
        grad_branch = 2.0 * (residual + branch - values)
    if len(weights) == 1:
        return ((phi, grad_branch),)
    sigmoid = torch.sigmoid(pre)
    grad_pre = torch.einsum("...ev,...v->...e", weights[1], grad_branch) * (sigmoid * (1.0 + pre * (1.0 - sigmoid)))
    return ((phi, grad_pre), (hidden, grad_branch))


class Atlas(ScanForm, nn.Module):
    def __init__(self, model: dict):
        super().__init__()
        atlas, heads, d_model = model["atlas"], model["num_heads"], model["d_model"]
        self.heads, self.head_dim = heads, d_model // heads
        self.features, _, self.hidden = memory_shapes(model)
        # model.atlas.chunk_size places the base memories (the rule); ScanForm's chunk_size is not used here: the
        # chunk-parallel form runs over those same chunks
        self.window, self.memory_chunk, self.grad_clip = atlas["window"], atlas["chunk_size"], atlas["grad_clip"]
        self.ns_steps, self.ns_coefficients = atlas["ns_steps"], atlas["ns_coefficients"]
        scales = atlas["eta_scales"]
        self.eta_on_update = scales == "update" or (scales == "auto" and atlas["ns_steps"] > 0)
        self.poly_key_dim = atlas["poly_key_dim"]
        self.ranges = tuple(tuple(atlas[f"{name}_range"]) for name in GATES)
        self.projection = nn.Linear(d_model, heads * 4 * self.head_dim, bias=False)
        self.conv = ShortConv(3 * heads * self.head_dim, atlas["conv_size"])
        self.gates = nn.Linear(d_model, heads * len(GATES), bias=True)
        degree = atlas["poly_degree"]
        self.poly_coefficients = None if degree == 1 else nn.Parameter(torch.zeros(heads, degree))
        shapes = ((self.features, self.hidden), (self.hidden, self.head_dim)) if self.hidden else \
            ((self.features, self.head_dim),)
        self.initial_memory = nn.ParameterList([nn.Parameter(torch.zeros(heads, m, n)) for m, n in shapes])
        self.memory_gain = nn.Parameter(torch.ones(heads, self.head_dim)) if atlas.get("memory_norm") else None
        self.out_norm = RMSNorm(self.head_dim, model["norm_eps"])
        self.out = nn.Linear(heads * self.head_dim, d_model, bias=False)

    def _inputs(self, x, cache, valid):
        batch, length = x.shape[:2]
        projected = self.projection(x).reshape(batch, length, self.heads, 4, self.head_dim)
        qkv = projected[:, :, :, :3].reshape(batch, length, -1)
        mixed, history = self.conv(qkv, None if cache is None else cache.get("conv"), valid)
        if cache is not None:
            cache["conv"] = history
        mixed = F.silu(mixed.float()).reshape(batch, length, self.heads, 3, self.head_dim)
        q, k, v = l2_normalize(mixed[:, :, :, 0]), l2_normalize(mixed[:, :, :, 1]), mixed[:, :, :, 2]
        gates = torch.sigmoid(self.gates(x).float()).reshape(batch, length, self.heads, len(GATES))
        alpha, theta, eta, gamma = (low + (high - low) * gates[..., i] for i, (low, high) in enumerate(self.ranges))
        coefficients = None if self.poly_coefficients is None else self.poly_coefficients.float()
        phi_k, phi_q = (feature_map(t, coefficients, self.poly_key_dim) for t in (k, q))
        return (phi_k, v, phi_q, alpha, theta, eta, gamma), projected[:, :, :, 3]

    def _gain(self):
        return None if self.memory_gain is None else self.memory_gain.float()

    def _initial_state(self, batch: int, device) -> dict:
        memory = tuple(w.float().expand(batch, *w.shape).clone() for w in self.initial_memory)
        window = (batch, self.window, self.heads)
        return {"memory": memory, "chunk_memory": memory, "momentum": tuple(torch.zeros_like(w) for w in memory),
                "window_keys": torch.zeros(*window, self.features, device=device),
                "window_values": torch.zeros(*window, self.head_dim, device=device),
                "window_weights": torch.zeros(window, device=device),
                "position": torch.zeros(batch, dtype=torch.long, device=device)}  # each row's tokens so far

    def _window_gradient(self, base, keys, values, weights):
        """``G = sum_i w_i clip(grad l(base; k_i, v_i))`` over the window axis 1 of ``keys [B, c, H, F]``."""
        expanded = tuple(w[:, None] for w in base)
        factors = gradient_factors(expanded, keys, values, self.head_dim, self._gain())
        norm_sq = sum(left.square().sum(-1) * right.square().sum(-1) for left, right in factors)
        clip = torch.ones_like(norm_sq) if self.grad_clip == 0 else \
            self.grad_clip * torch.rsqrt(torch.clamp_min(norm_sq, self.grad_clip**2))
        scale = weights * clip
        return tuple(torch.einsum("bch,bchm,bchn->bhmn", scale, left, right) for left, right in factors)

    def _orthogonalize(self, momentum):
        if self.ns_steps == 0:
            return momentum
        run = dict(steps=self.ns_steps, coefficients=self.ns_coefficients)
        if len(momentum) == 1:
            return (newton_schulz(momentum[0], **run),)
        w1, w2 = momentum
        w2t = F.pad(w2.transpose(-1, -2), (0, 0, 0, self.features - self.head_dim))
        result = newton_schulz(torch.stack([w1, w2t], dim=-3), **run)
        return result[..., 0, :, :], result[..., 1, :self.head_dim, :].transpose(-1, -2)

    def _step(self, state, token, real):
        """One token of every row (``real [B]``: which rows hold a token here; the others keep their state)."""
        phi_k, values, phi_q, alpha, theta, eta, gamma = token
        expand = real[:, None, None, None]
        chunk_start = expand & (state["position"] % self.memory_chunk == 0)[:, None, None, None]
        state["chunk_memory"] = tuple(torch.where(chunk_start, m, c)
                                      for m, c in zip(state["memory"], state["chunk_memory"]))
        for name, new in (("window_keys", phi_k), ("window_values", values), ("window_weights", gamma)):
            shifted = torch.cat([state[name][:, 1:], new[:, None]], dim=1)
            state[name] = torch.where(real.reshape((-1,) + (1,) * (shifted.ndim - 1)), shifted, state[name])
        gradient = self._window_gradient(state["chunk_memory"], state["window_keys"], state["window_values"],
                                         state["window_weights"])
        gradient_scale = 1.0 if self.eta_on_update else eta[..., None, None]
        momentum = tuple(theta[..., None, None] * s - gradient_scale * g for s, g in zip(state["momentum"], gradient))
        update_scale = eta[..., None, None] if self.eta_on_update else 1.0
        memory = tuple(alpha[..., None, None] * m + update_scale * n
                       for m, n in zip(state["memory"], self._orthogonalize(momentum)))
        memory = tuple(torch.where(expand, new, old) for new, old in zip(memory, state["memory"]))
        momentum = tuple(torch.where(expand, new, old) for new, old in zip(momentum, state["momentum"]))
        state.update(memory=memory, momentum=momentum, position=state["position"] + real.long())
        return memory_apply(memory, phi_q, self.head_dim, self._gain())

    def _chunk_gradients(self, base, keys, values, weights):
        """``G_t`` of each of a chunk's b tokens at ``base``, per matrix ``[B, b, H, m, n]``, from ``keys [B, b + c - 1,
        H, F]`` (and values, weights), the chunk's tokens and the c - 1 before: ``_window_gradient``'s sum over
        each token's window (``window_index``), batched."""
        factors = gradient_factors(tuple(w[:, None] for w in base), keys, values, self.head_dim, self._gain())
        norm_sq = sum(left.square().sum(-1) * right.square().sum(-1) for left, right in factors)
        clip = torch.ones_like(norm_sq) if self.grad_clip == 0 else \
            self.grad_clip * torch.rsqrt(torch.clamp_min(norm_sq, self.grad_clip**2))
        scale = (weights * clip)[:, self.window_index]  # [B, b, c, H]
        return tuple(torch.einsum("btch,btchm,btchn->bthmn", scale, left[:, self.window_index],
                                  right[:, self.window_index]) for left, right in factors)

    def _chunked(self, state, inputs, valid) -> torch.Tensor:
        """The outputs ``[B, T, H, D]`` of ``inputs`` in the chunk-parallel form (module docstring); ``state`` updated
        as ``_step`` token by token would leave it. Padded positions output zeros (the LM carries the last real
        token's hidden state over them)."""
        phi_k, values, phi_q, alpha, theta, eta, gamma = inputs
        batch, length = valid.shape
        size, window = self.memory_chunk, self.window
        rows = torch.arange(batch, device=valid.device)[:, None]
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)  # each row's real tokens first, in order
        counts = valid.sum(1)
        offsets = state["position"] % size  # where each row's first token falls in its chunk
        chunks = int(((offsets + counts).max() + size - 1) // size)
        aligned = torch.arange(chunks * size, device=valid.device)[None]  # [1, N b] row positions modulo b onwards
        packed_index = aligned - offsets[:, None]  # which packed token sits at each aligned position
        real = (packed_index >= 0) & (packed_index < counts[:, None])
        source = order[rows, packed_index.clamp(0, length - 1)]

        def place(x, fill):
            return torch.where(real.reshape(real.shape + (1,) * (x.ndim - 2)), x[rows, source], fill)

        alpha, theta, eta = place(alpha, 1.0), place(theta, 1.0), place(eta, 0.0)
        phi_q = place(phi_q, 0.0)
        step = (eta if not self.eta_on_update else real.float()[..., None].expand_as(eta))
        update = (eta if self.eta_on_update else real.float()[..., None].expand_as(eta))
        # the Omega window's tokens: b zeros, the cache's last c tokens, this call's packed (zero weight after)
        taken = torch.arange(length, device=valid.device)[None] < counts[:, None]
        history = {}
        for name, x in (("window_keys", phi_k), ("window_values", values), ("window_weights", gamma)):
            packed = torch.where(taken.reshape(taken.shape + (1,) * (x.ndim - 2)), x[rows, order], 0.0)
            zeros = packed.new_zeros((batch, size) + packed.shape[2:])
            history[name] = torch.cat([zeros, state[name], packed, zeros], dim=1)
        extent = torch.arange(size + window - 1, device=valid.device)[None]
        base = tuple(torch.where((offsets == 0).reshape(-1, 1, 1, 1), m, c)
                     for m, c in zip(state["memory"], state["chunk_memory"]))
        memory, momentum, chunk_memory = state["memory"], state["momentum"], state["chunk_memory"]
        last_chunk = (offsets + counts - 1) // size  # the chunk of each row's last token (-1: none)
        self.window_index = (torch.arange(size, device=valid.device)[:, None]
                             + torch.arange(window, device=valid.device)[None])  # [b, c]: token t's window
        outputs = []
        for n in range(chunks):
            span = slice(n * size, (n + 1) * size)
            # the chunk's tokens and the c - 1 before them: aligned position a is history entry b + c + a - offset
            extended = (size + n * size + 1 - offsets)[:, None] + extent
            gradients = self._chunk_gradients(base, *(history[name][rows, extended] for name in
                                                      ("window_keys", "window_values", "window_weights")))
            momenta = _decayed_sums(theta[:, span], tuple(-step[:, span, :, None, None] * g for g in gradients),
                                    momentum)
            updates = self._orthogonalize(momenta)
            memories = _decayed_sums(alpha[:, span], tuple(update[:, span, :, None, None] * u for u in updates),
                                     memory)
            outputs.append(memory_apply(memories, phi_q[:, span], self.head_dim, self._gain()))
            ends = (last_chunk == n).reshape(-1, 1, 1, 1)
            chunk_memory = tuple(torch.where(ends, b, c) for b, c in zip(base, chunk_memory))
            memory, momentum = tuple(m[:, -1] for m in memories), tuple(s[:, -1] for s in momenta)
            base = memory
        last_seen = size + counts[:, None] + torch.arange(window, device=valid.device)[None]
        for name, tokens in history.items():
            state[name] = tokens[rows, last_seen]  # the last c tokens seen
        state.update(memory=memory, momentum=momentum, chunk_memory=chunk_memory,
                     position=state["position"] + counts)
        y = torch.cat(outputs, dim=1)  # [B, N b, H, D] at aligned positions
        out = torch.zeros(batch, length, *y.shape[2:], dtype=y.dtype, device=y.device)
        gathered = y[rows, (torch.arange(length, device=valid.device)[None] + offsets[:, None]).clamp(
            max=y.shape[1] - 1)]
        out[rows.expand(batch, length)[taken], order[taken]] = gathered[taken]
        return out

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: dict | None = None):
        valid = real_tokens(positions)  # a recurrence: only which tokens are real matters
        inputs, output_gate = self._inputs(x, cache, valid)
        state = cache.get("memory") if cache is not None else None
        state = state if state is not None else self._initial_state(x.shape[0], x.device)
        if self.chunked(x.shape[1]):
            outputs = self._chunked(state, inputs, valid)
        else:
            outputs = torch.stack([self._step(state, tuple(t[:, i] for t in inputs), valid[:, i])
                                   for i in range(x.shape[1])], dim=1)
        if cache is not None:
            cache["memory"] = state
        y = self.out_norm(outputs.to(x.dtype), gate=output_gate)
        return self.out(y.reshape(*x.shape[:2], -1)), cache


def _decayed_sums(decays: torch.Tensor, inputs: tuple, initial: tuple) -> tuple:
    """Per matrix, every ``X_t = decays_t X_{t-1} + inputs_t`` of a chunk from ``initial`` (``decays [B, b, H]``,
    inputs ``[B, b, H, m, n]``), in the recurrent form's order of operations (an axpy a token: the costly terms,
    the gradients and Newton-Schulz, are batched over the chunk around it)."""
    outputs = []
    for x, x0 in zip(inputs, initial):
        steps = []
        for t in range(decays.shape[1]):
            x0 = decays[:, t, :, None, None] * x0 + x[:, t]
            steps.append(x0)
        outputs.append(torch.stack(steps, dim=1))
    return tuple(outputs)


MIXERS = {"atlas": Atlas}
