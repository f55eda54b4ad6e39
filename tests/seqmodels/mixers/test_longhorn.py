"""LongHorn and MuonSSM-on-LongHorn: the mixers against a token-by-token reference of their equations,
decoding, document isolation, reduction to the backbone, FLOPs and config validation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pallas_kernels.newton_schulz import newton_schulz
from seqmodels.config import ConfigError, ModelConfig
from seqmodels.config_io import load_config
from seqmodels.mixers import build_mixer, mixer_flops_per_token
from seqmodels.mixers.longhorn import LonghornConfig
from seqmodels.mixers.muonssm import MuonSSMConfig

NAMES = ["longhorn", "muonssm_longhorn"]
FP32_TOL = 1e-4  # float32 associative scan vs sequential loop: summation order only, outputs ~0.1-1


def config(**kwargs):
    defaults = dict(d_model=16, num_heads=2, max_seq_len=64, kernel_impl="xla", init_std=0.3,
                    longhorn=LonghornConfig(state_dim=4, expand=2, dt_min=0.05, dt_max=0.5))
    defaults.update(kwargs)
    return ModelConfig(**defaults)


def inputs(batch=2, length=11, seed=0):
    return jax.random.normal(jax.random.key(seed), (batch, length, 16))


def reference(mixer, x, *, gamma=0.0, tau=1.0, ns_steps=0, groups=1):
    """The module docstring's equations one token at a time in numpy (NS_k by the Newton-Schulz op)."""
    p = {name: np.asarray(value) for name, value in nnx.to_flat_state(nnx.state(mixer, nnx.Param))}
    get = lambda name: p[(name, "kernel")] if (name, "kernel") in p else p[(name,)]  # noqa: E731
    x = np.asarray(x, np.float64)
    projected = np.einsum("btd,dpc->btpc", x, get("in_proj"))
    u_raw, z = projected[:, :, 0], projected[:, :, 1]
    conv, width = p[("conv", "weight")], p[("conv", "weight")].shape[0]  # y_t = bias + sum_lag w[lag] x_{t-lag}
    padded = np.concatenate([np.zeros((x.shape[0], width - 1, u_raw.shape[-1])), u_raw], 1)
    u = p[("conv", "bias")] + sum(padded[:, width - 1 - lag:width - 1 - lag + x.shape[1]] * conv[lag]
                                  for lag in range(width))
    u = u / (1 + np.exp(-u))
    kq = np.einsum("btc,cpn->btpn", u, get("kq_proj"))
    k, q = kq[:, :, 0], kq[:, :, 1]
    dt = 1 / (1 + np.exp(-(u @ get("dt_down") @ get("dt_up") + p[("t_bias",)])))
    step = dt / (1 + dt * np.sum(k * k, -1, keepdims=True))
    batch, length, channels = u.shape
    h = np.zeros((batch, channels, k.shape[-1]))
    velocity = np.zeros_like(h)
    ys = []
    for t in range(length):
        injection = (step[:, t] * u[:, t])[:, :, None] * k[:, t, None, :]
        if ns_steps:
            blocks = injection.reshape(batch, groups, channels // groups, -1)
            blocks = np.asarray(newton_schulz(jnp.asarray(blocks, jnp.float32), steps=ns_steps, impl="xla"))
            injection = blocks.reshape(injection.shape)
        velocity = gamma * velocity + tau * injection
        h = (1 - step[:, t, :, None] * k[:, t, None, :] ** 2) * h + velocity
        ys.append(np.einsum("bcn,bn->bc", h, q[:, t]) + p[("skip",)] * u[:, t])
    y = np.stack(ys, 1) * (z / (1 + np.exp(-z)))
    return y @ get("out")


@pytest.mark.slow
@pytest.mark.parametrize("name, muon", [
    ("longhorn", {}),
    ("muonssm_longhorn", dict(gamma=0.8, tau=0.7, ns_steps=1, ns_scope="all")),
    ("muonssm_longhorn", dict(gamma=0.5, tau=1.0, ns_steps=3, ns_scope="head")),
])
def test_mixer_matches_the_token_by_token_reference_of_its_equations(name, muon):
    settings = MuonSSMConfig(**muon) if muon else MuonSSMConfig()
    mixer = build_mixer(name, config(muonssm=settings), nnx.Rngs(1))
    x = inputs()
    y = mixer(x)[0]
    groups = 1 if not muon or muon["ns_scope"] == "all" else 2
    expected = reference(mixer, x, gamma=muon.get("gamma", 0.0), tau=muon.get("tau", 1.0),
                         ns_steps=muon.get("ns_steps", 0), groups=groups)
    assert float(jnp.abs(y).mean()) > 1e-2  # not a comparison of near-zeros
    np.testing.assert_allclose(y, expected, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_training_form_matches_prefill_then_step_by_step_decoding(name):
    mixer = build_mixer(name, config(), nnx.Rngs(2))
    x = inputs(length=13)
    full = mixer(x)[0]
    cache = mixer.init_cache(2, 13, jnp.float32)
    head, cache = mixer(x[:, :4], cache=cache)
    steps = [head]
    for t in range(4, 13):
        y, cache = mixer(x[:, t:t + 1], cache=cache)
        steps.append(y)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_packed_documents_are_isolated_and_gradients_reach_every_parameter(name):
    mixer = build_mixer(name, config(), nnx.Rngs(3))
    first, second = inputs(1, 7, seed=4), inputs(1, 9, seed=5)
    x = jnp.concatenate([jnp.concatenate([first, second], 1), jnp.concatenate([second, first], 1)])
    segment_ids = jnp.array([[1] * 7 + [2] * 9, [1] * 9 + [2] * 7])
    weights = jax.random.normal(jax.random.key(6), x.shape)

    def loss(model):
        y = model(x, segment_ids=segment_ids)[0]
        return jnp.sum(y * weights), y

    grads, y = nnx.grad(loss, has_aux=True)(mixer)
    np.testing.assert_allclose(y[0, 7:], y[1, :9], atol=FP32_TOL)
    joined = mixer(x)[0]
    assert not np.allclose(joined[0, 7:], joined[1, :9], atol=1e-3)
    norms = {"/".join(map(str, path)): float(jnp.linalg.norm(g)) for path, g in nnx.to_flat_state(grads)}
    assert len(norms) >= 7 and all(np.isfinite(list(norms.values())))
    assert not [path for path, norm in norms.items() if norm == 0.0], norms


def test_muonssm_longhorn_with_zero_steps_and_zero_gamma_is_longhorn():
    plain = config(muonssm=MuonSSMConfig(gamma=0.0, ns_steps=0))
    muon, base = build_mixer("muonssm_longhorn", plain, nnx.Rngs(7)), build_mixer("longhorn", plain, nnx.Rngs(7))
    x = inputs(seed=8)
    np.testing.assert_allclose(muon(x)[0], base(x)[0], atol=1e-6)
    default = build_mixer("muonssm_longhorn", config(), nnx.Rngs(7))
    assert not np.allclose(default(x)[0], base(x)[0], atol=1e-3)


def test_flops_follow_the_documented_formula():
    cfg = config()
    d, channels, state, rank, conv = 16, 32, 4, 1, 4
    projections = 2 * d * 2 * channels + 2 * channels * (2 * state + rank) + 2 * rank * channels + 2 * channels * d
    assert mixer_flops_per_token("longhorn", cfg, 64) == projections + 2 * conv * channels + 6 * channels * state
    assert mixer_flops_per_token("muonssm_longhorn", cfg, 64) == projections + 2 * conv * channels + 9 * channels * state
    no_momentum = dataclasses.replace(cfg, muonssm=MuonSSMConfig(gamma=0.0))
    assert mixer_flops_per_token("muonssm_longhorn", no_momentum, 64) == mixer_flops_per_token("longhorn", cfg, 64)


@pytest.mark.parametrize("override, message", [
    ("model.longhorn.state_dim=0", r"model.longhorn.state_dim: must be >= 1, got 0"),
    ("model.longhorn.dt_max=1.0", r"model.longhorn.dt_min: need 0 < dt_min <= dt_max < 1"),
    ("model.longhorn.dt_rank=-1", r"model.longhorn.dt_rank: must be >= 0, got -1"),
])
def test_bad_longhorn_settings_are_rejected_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.d_model=64", override])
