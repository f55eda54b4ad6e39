"""The twins' chunk-parallel forms (``seqmodels.hf.torch.chunked``) equal their token-by-token scans: outputs,
final states and gradients, at T = 37 over chunks of 16 (not a multiple), from a non-zero state, with a left- and a
right-padded row; LongHorn's and MuonSSM-LongHorn's diagonal scans likewise, over chunks that do and do not divide
T; and whole exported models give the recurrent form's logits chunked, and decode on from a chunked prefill as
from a recurrent one.

Tolerances (float32, max abs): 1e-5 on outputs and states of O(1) and on their gradients; the two forms sum the
same terms in another order (the triangular solve against forward substitution), so only round-off differs.
"""

import dataclasses
import math

import numpy as np
import pytest
from export_parity import BASE_CONFIG, load_torch, random_params, tiny_config

TOLERANCE = 1e-5
BATCH, LENGTH, HEADS, KEY, VALUE, CHUNK = 2, 37, 3, 8, 5, 16
CHUNKED_MIXERS = ("deltanet", "gated_deltanet", "mamba2", "muonssm_gated_deltanet", "muonssm_mamba2", "longhorn",
                  "muonssm_longhorn", "atlas", "atlas_mag")
# Atlas's settings that change its chunk form's terms: configs/atlas.yaml (deep memory, degree-2 features,
# Newton-Schulz, eta on the update), Titans (no features, no Newton-Schulz), OmegaNet, and a linear memory
# with memory_norm and eta on the gradient. That last one without Newton-Schulz: 5 steps of its backward on
# one [F, D] matrix amplify float32 round-off: the two forms' gradients differ by ~3e-4 (relative, in norm) on
# the first layer's gate bias with them, 2e-7 without, so the Newton-Schulz gradients are checked on the deep memory's two matrices.
ATLAS_VARIANTS = {"atlas": {}, "titans": {}, "omeganet": {},
                  "linear_memory_norm": dict(memory_depth=1, memory_norm=True, eta_scales="gradient", ns_steps=0)}


def _inputs(seed: int = 0):
    """Random delta-rule inputs (unit keys, as the mixers feed them), a non-zero state and momentum, and the
    validity of a left-padded (5) and a right-padded (7) row."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    keys = torch.nn.functional.normalize(normal(BATCH, LENGTH, HEADS, KEY), dim=-1)
    valid = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    valid[0, :5], valid[1, -7:] = False, False
    return dict(q=normal(BATCH, LENGTH, HEADS, KEY), k=keys, v=normal(BATCH, LENGTH, HEADS, VALUE),
                beta=torch.rand(BATCH, LENGTH, HEADS, generator=generator),
                log_decay=-0.5 * torch.rand(BATCH, LENGTH, HEADS, generator=generator),
                state=normal(BATCH, HEADS, KEY, VALUE), momentum=normal(BATCH, HEADS, KEY, VALUE)), valid


def _momentum_scan(q, k, w, beta, log_decay, gamma, state, momentum, valid):
    """The MuonSSM twins' token-by-token step (``muonssm.py``), beta None for the Mamba2 backbone."""
    import torch

    from seqmodels.hf.torch.recurrences import keep_real
    outputs = []
    for t in range(q.shape[1]):
        new_momentum = gamma * momentum + k[:, t, :, :, None] * w[:, t, :, None, :]
        decayed = torch.exp(log_decay[:, t])[..., None, None] * state
        if beta is not None:
            predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], decayed)
            decayed = decayed - beta[:, t, :, None, None] * k[:, t, :, :, None] * predicted[:, :, None, :]
        state = keep_real(valid, t, decayed + new_momentum, state)
        momentum = keep_real(valid, t, new_momentum, momentum)
        outputs.append(q.shape[-1] ** -0.5 * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outputs, dim=1), state, momentum


def _forms(name: str):
    """``(recurrent, chunked, the inputs they differentiate)``: two functions of the inputs dict -> outputs tuple."""
    from seqmodels.hf.torch import chunked, recurrences
    gamma = 0.7
    if name == "delta_rule":
        args = ("q", "k", "v", "beta", "log_decay", "state")
        return (lambda x, valid: recurrences.delta_rule_scan(*(x[a] for a in args), valid),
                lambda x, valid: chunked.chunk_delta_rule(*(x[a] for a in args), valid, chunk_size=CHUNK), args)
    if name == "gated_linear":
        args = ("q", "k", "v", "log_decay", "state")
        return (lambda x, valid: recurrences.gated_linear_scan(*(x[a] for a in args), valid),
                lambda x, valid: chunked.chunk_gated_linear(*(x[a] for a in args), valid, chunk_size=CHUNK), args)
    with_beta = name == "momentum_delta_rule"
    args = ("q", "k", "v", "beta", "log_decay", "state", "momentum") if with_beta else \
        ("q", "k", "v", "log_decay", "state", "momentum")

    def unpack(x):
        return x["q"], x["k"], x["v"], x["beta"] if with_beta else None, x["log_decay"], x["state"], x["momentum"]

    def recurrent(x, valid):
        q, k, w, beta, log_decay, state, momentum = unpack(x)
        return _momentum_scan(q, k, w, beta, log_decay, gamma, state, momentum, valid)

    def chunk(x, valid):
        q, k, w, beta, log_decay, state, momentum = unpack(x)
        return chunked.chunk_momentum(q, k, w, beta, log_decay, math.log(gamma), state, momentum, valid,
                                      chunk_size=CHUNK)
    return recurrent, chunk, args


@pytest.mark.parametrize("name", ["delta_rule", "gated_linear", "momentum_delta_rule", "momentum_linear"])
def test_chunked_matches_recurrent_in_outputs_final_state_and_gradients_on_padded_rows(name):
    import torch
    recurrent, chunk, differentiated = _forms(name)
    inputs, valid = _inputs()
    results, gradients = [], []
    for form in (recurrent, chunk):
        x = {key: value.clone().requires_grad_(key in differentiated) for key, value in inputs.items()}
        outputs = form(x, valid)
        weights = [torch.randn(out.shape, generator=torch.Generator().manual_seed(i)) for i, out in enumerate(outputs)]
        loss = sum((w * out).sum() for w, out in zip(weights, outputs))
        gradients.append(torch.autograd.grad(loss, [x[key] for key in differentiated]))
        results.append(outputs)
    assert float(results[0][0].abs().max()) > 0.1 and float(results[0][1].abs().max()) > 0.1  # O(1), not zeros
    for a, b in zip(*results):
        assert float((a - b).abs().max()) < TOLERANCE, float((a - b).abs().max())
    for key, a, b in zip(differentiated, *gradients):
        assert float(a.abs().max()) > 1e-3, key  # the gradient reaches every input
        assert float((a - b).abs().max()) < TOLERANCE, (key, float((a - b).abs().max()))


def _longhorn_twin(mixer: str):
    """The PyTorch LongHorn / MuonSSM-LongHorn twin at the base config's settings, gamma 0.7 (d_model 64: D = 128
    channels of state 16, as the exported models)."""
    from seqmodels.hf.remote_code import hf_config_from_model
    from seqmodels.hf.torch.mixers import MIXERS
    config = tiny_config(BASE_CONFIG)
    config = dataclasses.replace(config, mixers=(mixer,), muonssm=dataclasses.replace(config.muonssm, gamma=0.7))
    return MIXERS[mixer](hf_config_from_model(config, torch_dtype="float32")["model"])


def _longhorn_inputs(twin, length: int):
    """``keep`` in [0.5, 1), ``written`` and ``k`` as the mixer forms them, non-zero entering caches, and the validity
    of a left-padded (5) and a right-padded (7) row."""
    import torch
    generator = torch.Generator().manual_seed(length)
    normal = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    shape = (BATCH, twin.channels, twin.state_dim)
    valid = torch.ones(BATCH, length, dtype=torch.bool)
    valid[0, :5], valid[1, -7:] = False, False
    return dict(keep=1.0 - 0.5 * torch.rand(BATCH, length, *shape[1:], generator=generator),
                written=normal(BATCH, length, twin.channels), k=normal(BATCH, length, twin.state_dim) / 2,
                state=normal(*shape), velocity=normal(*shape)), valid


@pytest.mark.parametrize("mixer", ["longhorn", "muonssm_longhorn"])
@pytest.mark.parametrize("length, chunk_size", [(37, 16), (48, 16), (37, 64)], ids=["ragged", "dividing", "one-chunk"])
def test_longhorn_chunked_scan_matches_recurrent_in_states_caches_and_gradients_on_padded_rows(mixer, length,
                                                                                                chunk_size):
    """The twin's ``recurrence`` (states ``[B, T, D, N]`` and the caches it leaves) in both scan forms, from
    non-zero entering caches; MuonSSM's injection scale and velocity included."""
    import torch

    from seqmodels.hf.torch.chunked import set_scan_form
    twin = _longhorn_twin(mixer)
    inputs, valid = _longhorn_inputs(twin, length)
    names = ("state", "velocity") if mixer == "muonssm_longhorn" else ("state",)
    differentiated = ("keep", "written", "k", *names)
    results, gradients = [], []
    for form in ("recurrent", "chunked"):
        assert set_scan_form(twin, form, chunk_size=chunk_size) == 1
        x = {key: value.clone().requires_grad_(key in differentiated) for key, value in inputs.items()}
        cache = {name: x[name] for name in names}
        states = twin.recurrence(x["keep"], x["written"], x["k"], cache, valid)
        outputs = (states, *(cache[name] for name in names))
        weights = [torch.randn(out.shape, generator=torch.Generator().manual_seed(i)) for i, out in enumerate(outputs)]
        loss = sum((w * out).sum() for w, out in zip(weights, outputs))
        gradients.append(torch.autograd.grad(loss, [x[key] for key in differentiated]))
        results.append(outputs)
    assert all(float(out.detach().abs().max()) > 0.1 for out in results[0])  # O(1), not zeros
    for a, b in zip(*results):
        assert float((a - b).abs().max()) < TOLERANCE, float((a - b).abs().max())
    for key, a, b in zip(differentiated, *gradients):
        assert float(a.abs().max()) > 1e-3, key  # the gradient reaches every input
        assert float((a - b).abs().max()) < TOLERANCE, (key, float((a - b).abs().max()))


def test_a_padded_step_of_the_chunk_form_leaves_the_state_unchanged():
    """A row that is all padding keeps its entering state and momentum exactly (decay 1, input 0)."""
    import torch

    from seqmodels.hf.torch.chunked import chunk_delta_rule, chunk_diagonal_scan, chunk_momentum
    x, _ = _inputs()
    valid = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    _, state = chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["log_decay"], x["state"], valid, chunk_size=CHUNK)
    torch.testing.assert_close(state, x["state"], rtol=0, atol=0)
    _, state, momentum = chunk_momentum(x["q"], x["k"], x["v"], x["beta"], x["log_decay"], math.log(0.7), x["state"],
                                        x["momentum"], valid, chunk_size=CHUNK)
    torch.testing.assert_close(state, x["state"], rtol=0, atol=0)
    torch.testing.assert_close(momentum, x["momentum"], rtol=0, atol=0)
    decay, injection = torch.rand(BATCH, LENGTH, KEY, VALUE), torch.randn(BATCH, LENGTH, KEY, VALUE)
    _, state = chunk_diagonal_scan(decay, injection, x["state"][:, 0], valid, chunk_size=CHUNK)
    torch.testing.assert_close(state, x["state"][:, 0], rtol=0, atol=0)


def test_chunk_forms_refuse_mismatched_shapes_and_unknown_scan_forms():
    import torch

    from seqmodels.hf.torch.chunked import chunk_delta_rule, chunk_diagonal_scan, set_scan_form
    x, _ = _inputs()
    with pytest.raises(ValueError, match=r"state must be \[B, H, K, V\] = \[2, 3, 8, 5\]"):
        chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["log_decay"], x["state"][:, :1])
    with pytest.raises(ValueError, match=r"log_decay must be \[B, T, H\]"):
        chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], x["log_decay"][:, :3], x["state"])
    with pytest.raises(ValueError, match=r"state must be \[B, \.\.\.\] = \[2, 3, 8, 5\]"):
        chunk_diagonal_scan(x["q"][..., None], x["q"][..., None].expand(-1, -1, -1, -1, 5), x["state"][:, :1])
    with pytest.raises(ValueError, match=r"decay must be shaped as injection \[2, 37, 3, 8\] or broadcast to it"):
        chunk_diagonal_scan(x["q"][:, :3], x["q"], x["state"][..., 0])
    with pytest.raises(ValueError, match="scan form 'parallel' is not one of auto, chunked, recurrent"):
        set_scan_form(torch.nn.Linear(2, 2), "parallel")


@pytest.mark.parametrize("mixer", CHUNKED_MIXERS)
def test_an_exported_model_gives_the_recurrent_logits_chunked_and_decodes_on_from_a_chunked_prefill(tmp_path, mixer):
    """Two layers of the mixer (chunks of 16 over 37 tokens, one row left-padded): chunked logits equal the
    recurrent ones, and a chunked prefill of 29 tokens then 8 decoded one at a time gives them too."""
    import torch

    from seqmodels.hf.export import export_model
    from seqmodels.hf.torch.chunked import set_scan_form
    from seqmodels.hf.torch.lm import CACHE_FIELD
    config = dataclasses.replace(tiny_config(BASE_CONFIG), mixers=(mixer, mixer))
    model = load_torch(export_model(config, random_params(config), tmp_path / "hf"))
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, config.vocab_size, size=(2, LENGTH)))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        assert set_scan_form(model, "recurrent") == 2
        recurrent = model(ids, attention_mask=mask).logits
        set_scan_form(model, "auto", chunk_size=CHUNK)
        chunked = model(ids, attention_mask=mask).logits
        prefill = 29
        output = model(ids[:, :prefill], attention_mask=mask[:, :prefill], use_cache=True)
        steps = [output.logits]
        for t in range(prefill, LENGTH):
            output = model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], use_cache=True,
                           **{CACHE_FIELD: getattr(output, CACHE_FIELD)})
            steps.append(output.logits)
        decoded = torch.cat(steps, dim=1)
    assert float(recurrent.abs().max()) > 1.0  # the tolerance is absolute on O(1) logits
    assert float((chunked - recurrent).abs().max()) < TOLERANCE
    assert float((decoded - recurrent).abs().max()) < TOLERANCE


@pytest.mark.parametrize("variant", sorted(ATLAS_VARIANTS))
def test_atlas_chunked_gives_the_recurrent_logits_and_parameter_gradients(tmp_path, variant):
    """Two Atlas layers over 37 tokens (memory chunks of 16: two whole and one partial; one row left-, one right-
    padded): the chunk-parallel form's logits and every parameter's gradient equal the token-by-token form's, and
    so do the logits of calls of 21, 7 and 9 tokens from the cache (chunked calls that start and end inside a
    memory chunk: the Omega window and the chunk's base memory come from the cache)."""
    import torch

    from seqmodels.hf.export import export_model
    from seqmodels.hf.torch.chunked import set_scan_form
    from seqmodels.hf.torch.lm import CACHE_FIELD
    config = tiny_config(BASE_CONFIG.with_name(f"{variant if variant != 'linear_memory_norm' else 'atlas'}.yaml"))
    config = dataclasses.replace(config, mixers=("atlas", "atlas"),
                                 atlas=dataclasses.replace(config.atlas, **ATLAS_VARIANTS[variant]))
    model = load_torch(export_model(config, random_params(config), tmp_path / "hf"))
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, config.vocab_size, size=(2, LENGTH)))
    mask = torch.ones_like(ids)
    mask[0, :4], mask[1, -6:] = 0, 0
    weights = torch.randn(2, LENGTH, config.vocab_size, generator=torch.Generator().manual_seed(0))
    results = []
    for form in ("recurrent", "auto"):
        assert set_scan_form(model, form) == 2
        model.zero_grad()
        logits = model(ids, attention_mask=mask).logits
        (weights * logits * mask[..., None]).sum().backward()
        results.append((logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()
                                          if p.grad is not None}))
    (recurrent, recurrent_grads), (chunked, chunked_grads) = results
    assert float(recurrent.abs().max()) > 1.0
    assert float((chunked - recurrent).abs().max()) < TOLERANCE
    with torch.no_grad():
        parts, output = [], None
        for start, end in ((0, 21), (21, 28), (28, LENGTH)):
            cache = {} if output is None else {CACHE_FIELD: getattr(output, CACHE_FIELD)}
            output = model(ids[:, start:end], attention_mask=mask[:, :end], use_cache=True, **cache)
            parts.append(output.logits)
    assert float((torch.cat(parts, dim=1) - recurrent).abs().max()) < TOLERANCE
    memory_grads = [name for name in recurrent_grads if "initial_memory" in name or "gates" in name]
    assert memory_grads and all(float(recurrent_grads[name].abs().max()) > 1e-3 for name in memory_grads)
    assert recurrent_grads.keys() == chunked_grads.keys()
    for name, gradient in recurrent_grads.items():
        scale = max(1.0, float(gradient.abs().max()))
        assert float((chunked_grads[name] - gradient).abs().max()) < TOLERANCE * scale, name
