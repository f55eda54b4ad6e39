"""Chunk-parallel forms of the twins' linear recurrences, in pure PyTorch (float32): what prefill and training
run, equal to the token-by-token scans of ``recurrences.py`` (which decoding keeps for one token a call).

Time is split into chunks of ``C`` tokens; inside a chunk tokens ``i = 1..C``, ``G_i`` is the cumulative log
decay from the chunk start (inclusive) and ``S_0`` the state entering it. Only the loop over chunks is
sequential (two or three matmuls a chunk); everything else is batched over chunks.

``chunk_gated_linear`` (chunked GLA with one decay per head, i.e. Mamba2's SSD / fla's ``chunk_simple_gla``)::

    S_t = e^{g_t} S_{t-1} + k_t v_t^T;   o_i = scale (e^{G_i} q_i^T S_0 + sum_{j <= i} e^{G_i - G_j} (q_i . k_j) v_j)

``chunk_delta_rule`` (the WY / UT-transform form of fla's ``chunk_gated_delta_rule`` and of the JAX
``pallas_kernels/gated_delta_rule/xla.py``)::

    S_t = e^{g_t} S_{t-1} + k_t u_t^T,  u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)
    (I + A) U = diag(beta) V - diag(beta e^G) K S_0,   A_ij = beta_i (k_i . k_j) e^{G_i - G_j}  (j < i)
    U = U~ - W S_0  (U~ = T diag(beta) V, W = T diag(beta e^G) K, T = (I + A)^-1: a triangular solve)
    o_i = scale (e^{G_i} q_i^T S_0 + sum_{j <= i} e^{G_i - G_j} (q_i . k_j) u_j),  S_C = e^{G_C} S_0 + sum_j e^{G_C - G_j} k_j u_j^T

``chunk_momentum`` (MuonSSM: a momentum of injections feeding a diagonal-decay or delta-rule state)::

    M_t = gamma M_{t-1} + k_t w_t^T;   S_t = e^{g_t} S_{t-1} [- beta_t k_t (k_t^T e^{g_t} S_{t-1})] + M_t
    S_i = e^{G_i} S_0 + a_i M_0 + sum_{j <= i} e^{G_i - G_j} k_j x_j^T + sum_{r <= i} c_ir k_r w_r^T
    c = D E,  D_ij = e^{G_i - G_j} m_j (j <= i),  E_jr = gamma^{#real in (r, j]} (r <= j),  a = D gamma^{#real in [1, i]}
    x = -T diag(beta) (e^G K S_0 + a^- K M_0 + (c^- o K K^T) W)   (c^-, a^-: c and a less their j = i term)

with ``x = 0`` (no delta correction) when ``beta`` is None (the Mamba2 backbone). The momentum's closed
form is the recurrence unrolled twice (S over M, M over the injections); the ``c`` matrix is one more
``[C, C] x [C, C]`` product a chunk.

``chunk_diagonal_scan`` (LongHorn's state and MuonSSM-LongHorn's velocity: a decay per state entry, so no
``[C, C]`` score matrix to share; ``pallas_kernels/linear_scan``)::

    h_t = a_t * h_{t-1} + b_t  (elementwise);  S_C = A_C * S_0 + l_C,  A_C = prod_i a_i,  l_i = a_i * l_{i-1} + b_i

``l`` (the chunk's own scan from a zero state) steps through the ``C`` positions of every chunk at once, one loop
over chunks carries the entering states ``S_0``, and a second pass through the ``C`` positions, from each chunk's
``S_0``, gives every ``h`` by the token scan's own update: ``2 C + T / C`` batched steps instead of ``T``, and
only products of decays in ``(0, 1]`` (no ``e^{-G}``, no exponent of a difference).

Padding (``valid [B, T]`` False) is a step that leaves every state as it was, exactly as the scans' ``keep_real``:
at a padded step the decay is 1 (``g = 0``, the momentum's and ``a`` too), ``beta`` and the injection are 0 and the
momentum does not enter the state (``m = 0``). ``T`` need not be a multiple of ``C``: the tail is padded the
same way and its outputs dropped. Every exponent is a difference ``G_i - G_j`` with ``j <= i`` (or ``G_i``), so
``<= 0``; masked entries are set to ``-inf`` before ``exp``. Gradients come from autograd through these
functions (``torch.linalg.solve_triangular`` included).

Which form a mixer runs (``scan_form``): ``auto`` (the default) chunks any call of more than one token (a
training forward, a prefill, which also fills the decoding cache with the chunk form's final state) and steps
a single decoded token; ``chunked`` / ``recurrent`` force one form (``set_scan_form``; the speed benchmark
and the equality tests use it). On CUDA, where flash-linear-attention / mamba_ssm are installed, the layers they
match run those kernels instead (``kernels.py``); this pure-PyTorch path is the fallback on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SCAN_FORMS = ("auto", "chunked", "recurrent")
CHUNK_SIZE = 64


class ScanForm:
    """The choice between a mixer's chunk-parallel and token-by-token forms (``scan_form``, ``chunk_size``)."""

    scan_form = "auto"
    chunk_size = CHUNK_SIZE

    def chunked(self, length: int) -> bool:
        """Whether a call of ``length`` tokens runs the chunk form."""
        return self.scan_form == "chunked" or (self.scan_form == "auto" and length > 1)


def set_scan_form(model: torch.nn.Module, form: str, chunk_size: int | None = None) -> int:
    """Set ``form`` (one of ``SCAN_FORMS``) and ``chunk_size`` on every recurrent mixer of ``model``; the number set."""
    if form not in SCAN_FORMS:
        raise ValueError(f"scan form {form!r} is not one of {', '.join(SCAN_FORMS)}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    count = 0
    for module in model.modules():  # by attribute: a loaded export's modules are copies of these classes
        if isinstance(getattr(type(module), "scan_form", None), str):
            module.scan_form = form
            if chunk_size is not None:
                module.chunk_size = chunk_size
            count += 1
    return count


def _heads_first(x: torch.Tensor, length: int, chunk_size: int) -> torch.Tensor:
    """``[B, T, H, ...]`` -> ``[B, H, N, C, ...]`` float32, the time axis zero-padded to ``N C``."""
    x = x.float().movedim(1, 2)
    pad = length - x.shape[2]
    if pad:
        x = F.pad(x, (0, 0) * (x.ndim - 3) + (0, pad))
    return x.reshape(*x.shape[:2], -1, chunk_size, *x.shape[3:])


def _prepare(valid, chunk_size, log_decay, q, *inputs):
    """Chunked ``(real [B, H, N, C], log_decay, q, inputs...)`` with padded steps made no-ops (decay 1, inputs 0;
    the queries kept: a padded step reads the state as the scans do)."""
    batch, steps, heads = log_decay.shape
    if valid is None:
        valid = torch.ones(batch, steps, dtype=torch.bool, device=log_decay.device)
    real = valid[:, :, None].expand(batch, steps, heads)
    padded = -(-steps // chunk_size) * chunk_size
    chunked = [_heads_first(torch.where(real, log_decay.float(), 0.0), padded, chunk_size),
               _heads_first(q, padded, chunk_size)]
    for x in inputs:
        if x is None:
            chunked.append(None)
            continue
        mask = real.reshape(batch, steps, heads, *(1,) * (x.ndim - 3))
        chunked.append(_heads_first(torch.where(mask, x.float(), 0.0), padded, chunk_size))
    return (_heads_first(real.float(), padded, chunk_size) > 0, *chunked)


def _decay_matrix(cumulative: torch.Tensor, strict: bool = False) -> torch.Tensor:
    """``exp(G_i - G_j)`` for ``j <= i`` (``j < i`` when ``strict``), 0 elsewhere: ``[..., C, C]``."""
    size = cumulative.shape[-1]
    keep = torch.ones(size, size, dtype=torch.bool, device=cumulative.device).tril(-1 if strict else 0)
    return torch.exp((cumulative[..., :, None] - cumulative[..., None, :]).masked_fill(~keep, float("-inf")))


def _check(name: str, q, k, v, log_decay, state):
    if q.ndim != 4 or k.shape != q.shape or v.ndim != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{name}: q, k must be [B, T, H, K] and v [B, T, H, V] alike, got q {list(q.shape)}, "
                         f"k {list(k.shape)}, v {list(v.shape)}")
    if log_decay.shape != q.shape[:3]:
        raise ValueError(f"{name}: log_decay must be [B, T, H] = {list(q.shape[:3])}, got {list(log_decay.shape)}")
    expected = [q.shape[0], q.shape[2], q.shape[3], v.shape[3]]
    if list(state.shape) != expected:
        raise ValueError(f"{name}: state must be [B, H, K, V] = {expected}, got {list(state.shape)}")


def _finish(o, steps):
    """``o [B, H, N, C, V]`` -> ``[B, T, H, V]``, the padded tail dropped."""
    return o.reshape(*o.shape[:2], -1, o.shape[-1])[:, :, :steps].movedim(1, 2)


def _entering_states(state, through, keys, values, state_weights=None):
    """``(the state entering every chunk [B, H, N, K, V], the state after the last)`` by the one
    sequential loop: ``S <- e^{G_C} S + keys^T (values - W S)`` (``through [B, H, N]`` = ``e^{G_C}``; no ``W S``
    term without ``state_weights``). Batch and heads are flattened so that each chunk is two ``baddbmm`` s."""
    batch, heads, chunks = through.shape
    flat = lambda x: x.reshape(batch * heads, *x.shape[2:])  # noqa: E731
    keys, values, through = flat(keys).transpose(-1, -2), flat(values), flat(through)
    state_weights = None if state_weights is None else flat(state_weights)
    state, entering = state.float().reshape(batch * heads, *state.shape[2:]), []
    for n in range(chunks):
        entering.append(state)
        written = values[:, n] if state_weights is None else torch.baddbmm(values[:, n], state_weights[:, n], state,
                                                                          alpha=-1)
        state = torch.baddbmm(through[:, n, None, None] * state, keys[:, n], written)
    return (torch.stack(entering, dim=1).reshape(batch, heads, chunks, *state.shape[1:]),
            state.reshape(batch, heads, *state.shape[1:]))


def chunk_gated_linear(q, k, v, log_decay, state, valid=None, chunk_size=CHUNK_SIZE, scale=None):
    """``(o [B, T, H, V], final state)`` of ``S = e^g S + k v^T; o = scale S^T q`` (``scale`` None: K^-1/2),
    shapes as ``recurrences.gated_linear_scan``."""
    _check("chunk_gated_linear", q, k, v, log_decay, state)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    steps = q.shape[1]
    real, g, q, k, v = _prepare(valid, chunk_size, log_decay, q, k, v)
    cumulative = g.cumsum(-1)  # [B, H, N, C]
    local = ((q @ k.transpose(-1, -2)) * _decay_matrix(cumulative)) @ v  # every chunk's own part of o
    keys = k * torch.exp(cumulative[..., -1:] - cumulative)[..., None]
    entering, state = _entering_states(state, torch.exp(cumulative[..., -1]), keys, v)
    return _finish(scale * ((q * torch.exp(cumulative)[..., None]) @ entering + local), steps), state


def _unit_lower_solve(matrix, rhs):
    """``(I + matrix)^-1 rhs`` for a strictly lower-triangular ``matrix [..., C, C]``."""
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    return torch.linalg.solve_triangular(eye + matrix, rhs, upper=False, unitriangular=True)


def chunk_delta_rule(q, k, v, beta, log_decay, state, valid=None, chunk_size=CHUNK_SIZE):
    """``(o [B, T, H, V], final state)`` of ``recurrences.delta_rule_scan`` (same arguments) in the WY form."""
    _check("chunk_delta_rule", q, k, v, log_decay, state)
    if beta.shape != log_decay.shape:
        raise ValueError(f"chunk_delta_rule: beta must be [B, T, H] = {list(log_decay.shape)}, got {list(beta.shape)}")
    scale, steps = q.shape[-1] ** -0.5, q.shape[1]
    real, g, q, beta, k, v = _prepare(valid, chunk_size, log_decay, q, beta, k, v)
    cumulative = g.cumsum(-1)
    decay = _decay_matrix(cumulative)
    lower = beta[..., None] * (k @ k.transpose(-1, -2)) * decay.tril(-1)
    solved = _unit_lower_solve(lower, torch.cat([beta[..., None] * v, (beta * torch.exp(cumulative))[..., None] * k], -1))
    corrected_values, state_weights = solved.split([v.shape[-1], k.shape[-1]], dim=-1)  # U~, W [B, H, N, C, .]
    scores = (q @ k.transpose(-1, -2)) * decay
    keys = k * torch.exp(cumulative[..., -1:] - cumulative)[..., None]
    entering, state = _entering_states(state, torch.exp(cumulative[..., -1]), keys, corrected_values, state_weights)
    # o = scale (e^G q S_0 + scores (U~ - W S_0)) = scale ((e^G q - scores W) S_0 + scores U~), batched over chunks
    queries = q * torch.exp(cumulative)[..., None] - scores @ state_weights
    return _finish(scale * (queries @ entering + scores @ corrected_values), steps), state


def chunk_momentum(q, k, w, beta, log_decay, log_gamma, state, momentum, valid=None, chunk_size=CHUNK_SIZE,
                   scale=None):
    """``(o [B, T, H, V], final state, final momentum)`` of ``M = gamma M + k w^T; S = e^g S [- beta k k^T e^g S] + M;
    o = scale S^T q`` (``beta`` None: no delta correction; ``log_gamma`` = log gamma, a float; ``momentum`` shaped as
    ``state``; ``scale`` None: K^-1/2)."""
    _check("chunk_momentum", q, k, w, log_decay, state)
    if momentum.shape != state.shape:
        raise ValueError(f"chunk_momentum: momentum must be shaped as state {list(state.shape)}, "
                         f"got {list(momentum.shape)}")
    if beta is not None and beta.shape != log_decay.shape:
        raise ValueError(f"chunk_momentum: beta must be [B, T, H] = {list(log_decay.shape)}, got {list(beta.shape)}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    steps = q.shape[1]
    real, g, q, beta, k, w = _prepare(valid, chunk_size, log_decay, q, beta, k, w)
    cumulative, momentum_cumulative = g.cumsum(-1), (real.float() * log_gamma).cumsum(-1)
    entering = _decay_matrix(cumulative) * real.float()[..., None, :]  # D [B, H, N, C, C]
    carried = _decay_matrix(momentum_cumulative)  # E
    injected, from_momentum = entering @ carried, entering @ torch.exp(momentum_cumulative)[..., None]  # c, a
    key_scores, query_keys = k @ k.transpose(-1, -2), q @ k.transpose(-1, -2)
    injection_scores = (injected * query_keys) @ w  # [B, H, N, C, V]
    if beta is not None:
        own = real.float()[..., None] * carried  # the j = i term of c and a
        lower = beta[..., None] * key_scores * _decay_matrix(cumulative, strict=True)
        previous = (injected - own) * key_scores
        corrections = _unit_lower_solve(lower, beta[..., None] * (previous @ w))
        state_weights = _unit_lower_solve(lower, (beta * torch.exp(cumulative))[..., None] * k)
        momentum_weights = _unit_lower_solve(
            lower, (beta * (from_momentum[..., 0] - own.diagonal(dim1=-2, dim2=-1) * torch.exp(momentum_cumulative)))[
                ..., None] * k)
        scores = query_keys * _decay_matrix(cumulative)
    queries, momentum_queries = q * torch.exp(cumulative)[..., None], q * from_momentum
    keys = k * torch.exp(cumulative[..., -1:] - cumulative)[..., None]
    injected_keys = k * injected[..., -1, :, None]
    momentum_keys = k * torch.exp(momentum_cumulative[..., -1:] - momentum_cumulative)[..., None]
    state, momentum, outputs = state.float(), momentum.float(), []
    for n in range(q.shape[2]):
        o = queries[:, :, n] @ state + momentum_queries[:, :, n] @ momentum + injection_scores[:, :, n]
        new_state = (torch.exp(cumulative[:, :, n, -1])[..., None, None] * state
                     + from_momentum[:, :, n, -1, :, None] * momentum
                     + injected_keys[:, :, n].transpose(-1, -2) @ w[:, :, n])
        if beta is not None:
            x = -(state_weights[:, :, n] @ state + momentum_weights[:, :, n] @ momentum + corrections[:, :, n])
            o = o + scores[:, :, n] @ x
            new_state = new_state + keys[:, :, n].transpose(-1, -2) @ x
        outputs.append(scale * o)
        momentum = (torch.exp(momentum_cumulative[:, :, n, -1])[..., None, None] * momentum
                    + momentum_keys[:, :, n].transpose(-1, -2) @ w[:, :, n])
        state = new_state
    return _finish(torch.stack(outputs, dim=2), steps), state, momentum


def _broadcasts(shape, target) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


def chunk_diagonal_scan(decay, injection, state, valid=None, chunk_size=CHUNK_SIZE):
    """``(h [B, T, ...], final state)`` of ``h_t = decay_t * h_{t-1} + injection_t`` elementwise (``injection
    [B, T, ...]``, ``decay`` of its shape or broadcast to it, ``state [B, ...]`` float32; ``valid [B, T]``)."""
    batch, steps, *entry = injection.shape
    if list(state.shape) != [batch, *entry]:
        raise ValueError(f"chunk_diagonal_scan: state must be [B, ...] = {[batch, *entry]}, got {list(state.shape)}")
    if not _broadcasts(decay.shape, injection.shape):
        raise ValueError(f"chunk_diagonal_scan: decay must be shaped as injection {list(injection.shape)} or "
                         f"broadcast to it, got {list(decay.shape)}")
    decay, injection = decay.float(), injection.float()
    if valid is not None and not bool(valid.all()):  # (no full-size masks for a row without padding)
        real = valid.reshape(batch, steps, *(1,) * len(entry))
        decay, injection = torch.where(real, decay, 1.0), torch.where(real, injection, 0.0)
    decay = decay.expand(injection.shape)
    chunks = -(-steps // chunk_size)
    if chunks * chunk_size != steps:
        pad = (0, 0) * len(entry) + (0, chunks * chunk_size - steps)
        decay, injection = F.pad(decay, pad, value=1.0), F.pad(injection, pad)
    decay = decay.reshape(batch, chunks, chunk_size, *entry)  # [B, N, C, ...]
    injection = injection.reshape(batch, chunks, chunk_size, *entry)
    own = injection[:, :, 0]
    for i in range(1, chunk_size):  # l_C: every chunk's scan from a zero state at once
        own = decay[:, :, i] * own + injection[:, :, i]
    through, state, entering = decay.prod(dim=2), state.float(), []  # A_C
    for n in range(chunks):
        entering.append(state)
        state = through[:, n] * state + own[:, n]
    h, states = torch.stack(entering, dim=1), []
    for i in range(chunk_size):  # every chunk again, from its entering state
        h = decay[:, :, i] * h + injection[:, :, i]
        states.append(h)
    return torch.stack(states, dim=2).reshape(batch, chunks * chunk_size, *entry)[:, :steps], state
