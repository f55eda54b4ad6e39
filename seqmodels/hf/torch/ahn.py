"""AHN (``model.kind: ahn``) in PyTorch: the JAX ``seqmodels.models.ahn`` and ``ahn_compressor``.

A Llama-shaped layer whose attention keeps the first ``sinks`` tokens and the last ``ring = window - sinks``,
plus a compressor over the tokens that left (token ``s >= sinks`` leaves at step ``s + ring``). With
``h = RMSNorm(x)`` and the layer's post-RoPE ``q, k, v`` (keys / values expanded over the GQA groups for
the compressor; ``q, k`` L2-normalised per head there)::

    a_t = SWA(q, k, v)_t                                  sinks + the last ring tokens (itself included)
    gated_deltanet  beta = sigmoid(W_beta h), g = -exp(A_log) softplus(W_a h + dt_bias)
                    S <- e^g (I - beta k k^T) S + beta k v^T
    deltanet        the same with g = 0
    mamba2          Delta = softplus(W_a h + dt_bias), g = -exp(A_log) Delta;   S <- e^g S + Delta k v^T
    m_t = W_m,h (RMSNorm(Dh^-1/2 S_t^T q_t) * silu(W_gate h_t))     per head; S_t holds sinks <= s <= t - ring
    x <- x + W_o (a_t + m_t);   x <- x + MLP(RMSNorm(x))

Each token's write gates come from its own ``h``; the state is written in token order. At each position the
write is the token leaving there (a no-op write, zero key, strength and log decay, where none leaves), so the
compressor is one linear recurrence over the row's positions: a call of more than one token (training, a
prefill) runs its chunk-parallel form (``chunked.chunk_delta_rule`` / ``chunk_gated_linear``, or on CUDA fla's
``chunk_gated_delta_rule`` / ``chunk_simple_gla`` where installed: ``kernels.py``; ``scan_form`` as every recurrent
twin), a decoded token the token-by-token step (``recurrences.delta_rule_scan`` /
``gated_linear_scan``, the JAX decoding form; JAX trains with the chunked kernels, equal within float32
round-off).

A layer's cache: the attention's (the sink keys / values and the last ``ring``, ``attention``)
and the compressor's: its state and the last ``ring`` non-sink tokens' raw ``k, v`` and gates, the ones
still to leave. Its size is fixed by ``window`` whatever the length decoded. A whole row without a cache
runs the same rule from an empty one. (JAX keeps one ring of keys / values for both; here the attention
and the compressor each keep theirs, so a layer holds the ring's keys / values twice.)

Padded batches: positions are each row's own (``[B, T]``, -1 at padding); a token leaves when its row
reaches position ``s + ring``, a padded step writes nothing, and padding never enters the pending tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .chunked import ScanForm
from .kernels import KernelChoice, delta_rule, gated_linear
from .layers import RMSNorm, SwiGLU, l2_normalize, mlp_hidden, step_and_log_decay
from .recurrences import delta_rule_scan, gated_linear_scan

COMPRESSORS = {"gated_deltanet": dict(delta_rule=True, decays=True),
               "deltanet": dict(delta_rule=True, decays=False),
               "mamba2": dict(delta_rule=False, decays=True)}
PENDING = ("k", "v", "strength", "log_decay")  # what the compressor keeps of each token until it leaves


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, T, Hkv, Dh] -> [B, T, H, Dh]``: query head h reads key / value head ``h // (H / Hkv)``."""
    return x.repeat_interleave(heads // x.shape[2], dim=2)


class Compressor(ScanForm, KernelChoice, nn.Module):
    """The compressor of one layer (module docstring); parameter names as the JAX ``Compressor``."""

    def __init__(self, model: dict, *, head_dim: int):
        super().__init__()
        settings, width, heads = model["ahn"], model["d_model"], model["num_heads"]
        if settings["compressor"] not in COMPRESSORS:
            raise ValueError(f"model.ahn.compressor {settings['compressor']!r} has no PyTorch module; one of "
                             f"{', '.join(COMPRESSORS)}")
        rule = COMPRESSORS[settings["compressor"]]
        self.delta_rule, self.decays = rule["delta_rule"], rule["decays"]
        self.heads, self.head_dim = heads, head_dim
        self.ring, self.sinks = settings["window"] - settings["sinks"], settings["sinks"]
        if self.delta_rule:
            self.beta_proj = nn.Linear(width, heads, bias=False)
        if self.decays:
            self.decay_proj = nn.Linear(width, heads, bias=False)
            self.a_log = nn.Parameter(torch.zeros(heads))
            self.dt_bias = nn.Parameter(torch.zeros(heads))
        self.gate = nn.Linear(width, heads * head_dim, bias=False)
        self.norm = RMSNorm(head_dim, model["norm_eps"])
        self.readout = nn.Parameter(torch.zeros(heads, head_dim, head_dim))
        self.find_kernels("gated_delta_rule" if self.delta_rule else "simple_gla")

    def write_gates(self, h: torch.Tensor):
        """``(strength, log_decay)`` float32 ``[B, T, H]``: beta (delta rules) or Delta (mamba2), and g."""
        log_decay = h.new_zeros(h.shape[:2] + (self.heads,), dtype=torch.float32)
        if self.decays:
            step, log_decay = step_and_log_decay(self.decay_proj(h), self.dt_bias, self.a_log)
        if self.delta_rule:
            return torch.sigmoid(self.beta_proj(h).float()), log_decay
        return step, log_decay

    def _evicted(self, pending: dict, positions: torch.Tensor) -> dict:
        """The token leaving at each of ``positions [B, T]`` (row position ``t - ring``), gathered from ``pending``
        (its ``positions [B, P]``, -1 where a column holds no pending token of the row); where none leaves (and
        at padding), a no-op write (zero key, value and strength; zero log decay)."""
        source = torch.where(positions >= 0, positions - self.ring, torch.full_like(positions, -1))
        match = (pending["positions"][:, None, :] == source[:, :, None]) & (source >= self.sinks)[..., None]
        found = match.any(-1)  # [B, T]
        if pending["positions"].shape[1] == 0 or not bool(found.any()):
            return {name: pending[name].new_zeros(positions.shape + pending[name].shape[2:]) for name in PENDING}
        index = match.to(torch.int8).argmax(-1)  # [B, T]: the column of the leaving token
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        evicted = {}
        for name in PENDING:
            values = pending[name][rows, index]
            keep = found.reshape(found.shape + (1,) * (values.ndim - 2))
            evicted[name] = torch.where(keep, values, torch.zeros_like(values))
        return evicted

    def forward(self, h, q, k, v, positions: torch.Tensor, cache: dict) -> torch.Tensor:
        """``m [B, T, H, Dh]`` of the tokens at ``positions [B, T]`` (each row's, after those ``cache`` has seen)."""
        strength, log_decay = self.write_gates(h)
        writable = positions >= self.sinks  # the sinks never leave the attention; padding is -1
        incoming = {"k": k, "v": v, "strength": strength, "log_decay": log_decay,
                    "positions": torch.where(writable, positions, torch.full_like(positions, -1))}
        pending = cache.get("pending")
        if pending is None:
            pending = {name: value[:, :0] for name, value in incoming.items()}
        pending = {name: torch.cat([pending[name], value], dim=1) for name, value in incoming.items()}
        evicted = self._evicted(pending, positions)
        queries = l2_normalize(q)
        keys = l2_normalize(_expand(evicted["k"], self.heads))
        values = _expand(evicted["v"], self.heads).float()
        state = cache.get("state")
        if state is None:
            state = torch.zeros(q.shape[0], self.heads, self.head_dim, self.head_dim, device=q.device)
        chunked = self.chunked(q.shape[1])
        if self.delta_rule:
            arguments = (queries, keys, values, evicted["strength"], evicted["log_decay"], state)
            o, state = delta_rule(self, *arguments, chunk_size=self.chunk_size) if chunked else \
                delta_rule_scan(*arguments)
        else:
            arguments = (queries, keys * evicted["strength"][..., None], values, evicted["log_decay"], state)
            o, state = gated_linear(self, *arguments, chunk_size=self.chunk_size) if chunked else \
                gated_linear_scan(*arguments)
        newest = positions.max(dim=1, keepdim=True).values
        if "newest" in cache:
            newest = torch.maximum(newest, cache["newest"])
        still_to_leave = ((pending["positions"] >= 0) & (pending["positions"] > newest - self.ring)).any(dim=0)
        cache["pending"] = {name: value[:, still_to_leave] for name, value in pending.items()}
        cache.update(state=state, newest=newest)
        gated = self.norm(o.to(h.dtype), gate=self.gate(h).reshape(*h.shape[:2], self.heads, self.head_dim))
        return torch.einsum("bthd,hde->bthe", gated, self.readout.to(gated.dtype))


class AHNBlock(nn.Module):
    """One layer of the frozen base (names as the decoder LM's ``Block``) with its compressor ``ahn``."""

    def __init__(self, model: dict):
        super().__init__()
        settings = model["ahn"]
        self.mixer_norm = RMSNorm(model["d_model"], model["norm_eps"])
        self.mixer = Attention(model, window=settings["window"] - settings["sinks"], num_sinks=settings["sinks"])
        self.mlp_norm = RMSNorm(model["d_model"], model["norm_eps"])
        self.mlp = SwiGLU(model["d_model"], mlp_hidden(model))
        self.ahn = Compressor(model, head_dim=self.mixer.head_dim)

    def forward(self, x, positions, cache=None):
        """``x [B, T, D]`` at ``positions [B, T]`` -> ``(x, cache)``; no cache runs the row from an empty one."""
        cache = {} if cache is None else cache
        h = self.mixer_norm(x)
        attention_cache = cache.setdefault("attention", {})
        q, k, v = self.mixer._project(h, positions, attention_cache)
        heads = self.mixer.attend(q, k, v, positions, attention_cache)
        heads = heads + self.ahn(h, q, k, v, positions, cache.setdefault("compressor", {})).to(heads.dtype)
        x = x + self.mixer.out(heads.reshape(*x.shape[:2], -1))
        return x + self.mlp(self.mlp_norm(x)), cache
