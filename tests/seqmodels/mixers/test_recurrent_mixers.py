"""The recurrent mixers (Mamba2, DeltaNet, Gated DeltaNet, MuonSSM): training form vs decoding,
document isolation, gradients, MuonSSM's reduction to its backbone, and config validation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.config_io import load_config
from seqmodels.mixers import build_mixer, mixer_flops_per_token
from seqmodels.mixers.deltanet import DeltaNetConfig
from seqmodels.mixers.mamba2 import Mamba2Config
from seqmodels.mixers.muonssm import MuonSSMConfig

NAMES = ["mamba2", "deltanet", "gated_deltanet", "muonssm_mamba2", "muonssm_gated_deltanet"]
# One xdist worker per mixer, so its compiled forward is reused across the tests below.
MIXERS = [pytest.param(name, marks=pytest.mark.xdist_group(name)) for name in NAMES]
# float32: chunked (chunk 16, three chunks) vs token-by-token forms differ by summation order only;
# mixer outputs are of magnitude ~0.1-1, rounding ~1e-6.
FP32_TOL = 1e-4
LENGTH, PREFILL = 37, 5


def config(**kwargs):
    defaults = dict(d_model=32, num_heads=2, max_seq_len=64, kernel_impl="xla", init_std=0.2,
                    mamba2=Mamba2Config(state_dim=8, chunk_size=16), deltanet=DeltaNetConfig(chunk_size=16))
    defaults.update(kwargs)
    return ModelConfig(**defaults)


def inputs(batch=2, length=LENGTH, seed=0):
    return jax.random.normal(jax.random.key(seed), (batch, length, 32))


@nnx.jit
def forward(mixer, x, segment_ids):
    return mixer(x, segment_ids=segment_ids)[0]


@nnx.jit
def decode(mixer, x, cache):
    return mixer(x, cache=cache)


@pytest.mark.slow
@pytest.mark.parametrize("name", MIXERS)
def test_chunked_training_form_matches_prefill_then_step_by_step_decoding(name):
    mixer = build_mixer(name, config(), nnx.Rngs(0))
    x = inputs()
    full = forward(mixer, x, None)
    cache = mixer.init_cache(2, LENGTH, jnp.float32)
    head, cache = decode(mixer, x[:, :PREFILL], cache)  # chunked form from a (zero) cached state
    steps = [head]
    for t in range(PREFILL, LENGTH):
        y, cache = decode(mixer, x[:, t:t + 1], cache)  # the one-token recurrent step
        steps.append(y)
    assert float(jnp.abs(full).mean()) > 1e-2  # the mixer's output is not negligible
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=FP32_TOL, rtol=FP32_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", MIXERS)
def test_packed_documents_are_isolated_and_gradients_reach_every_parameter(name):
    mixer = build_mixer(name, config(), nnx.Rngs(1))
    first, second = inputs(1, 17, seed=2), inputs(1, 20, seed=3)
    # Row 0: [first | second]; row 1: [second | first]. Mixers are causal, so row 1's first 20
    # outputs are what `second` alone gives.
    x = jnp.concatenate([jnp.concatenate([first, second], 1), jnp.concatenate([second, first], 1)])
    segment_ids = jnp.array([[1] * 17 + [2] * 20, [1] * 20 + [2] * 17])
    weights = jax.random.normal(jax.random.key(4), x.shape)

    def loss(model):
        y = model(x, segment_ids=segment_ids)[0]
        return jnp.sum(y * weights), y

    grads, y = nnx.jit(nnx.grad(loss, has_aux=True))(mixer)
    np.testing.assert_allclose(y[0, 17:], y[1, :20], atol=FP32_TOL)
    joined = forward(mixer, x, None)  # without segment ids the second document sees the first
    assert not np.allclose(joined[0, 17:], joined[1, :20], atol=1e-3)
    norms = {"/".join(map(str, path)): float(jnp.linalg.norm(g)) for path, g in nnx.to_flat_state(grads)}
    assert len(norms) >= 12 and all(np.isfinite(list(norms.values())))
    assert not [path for path, norm in norms.items() if norm == 0.0], norms


@pytest.mark.parametrize("momentum, backbone", [
    pytest.param("muonssm_mamba2", "mamba2", marks=pytest.mark.xdist_group("muonssm_mamba2")),
    pytest.param("muonssm_gated_deltanet", "gated_deltanet", marks=pytest.mark.xdist_group("muonssm_gated_deltanet")),
])
def test_muonssm_with_zero_steps_and_zero_gamma_is_its_backbone(momentum, backbone):
    plain = config(muonssm=MuonSSMConfig(gamma=0.0, ns_steps=0))
    muon, base = build_mixer(momentum, plain, nnx.Rngs(5)), build_mixer(backbone, plain, nnx.Rngs(5))
    jax.tree.map(np.testing.assert_array_equal, nnx.state(muon), nnx.state(base))  # same parameters
    x = inputs(seed=6)
    np.testing.assert_allclose(forward(muon, x, None), forward(base, x, None), atol=1e-6)
    # The defaults (gamma = 0.9, k = 1) do change the output: the comparison can fail.
    default = build_mixer(momentum, config(), nnx.Rngs(5))
    assert not np.allclose(forward(default, x, None), forward(base, x, None), atol=1e-3)


@pytest.mark.parametrize("override, message", [
    ("model.muonssm.gamma=-0.1", r"model.muonssm.gamma: must be in \[0, 1\), got -0.1"),
    ("model.muonssm.gamma=1.0", r"model.muonssm.gamma: must be in \[0, 1\), got 1.0"),
    ("model.muonssm.ns_steps=-1", r"model.muonssm.ns_steps: k must be >= 0, got -1"),
    ("model.muonssm.tau=0", r"model.muonssm.tau: must be > 0"),
    ("model.muonssm.ns_coefficients=cubic", r"model.muonssm.ns_coefficients: must be muon or polar_express"),
    ("model.mamba2.head_dim=48",
     r"model.mamba2.head_dim: 48 does not divide model.mamba2.expand \* model.d_model = 256"),
    ("model.mamba2.chunk_size=24", r"model.mamba2.chunk_size: must be a power of two >= 16, got 24"),
    ("model.mamba2.dt_min=0.5", r"model.mamba2.dt_min: need 0 < dt_min <= dt_max"),
    ("model.deltanet.value_head_dim=-4", r"model.deltanet.value_head_dim: must be >= 0, got -4"),
    ("model.deltanet.chunk_size=8", r"model.deltanet.chunk_size: must be a power of two >= 16, got 8"),
])
def test_bad_recurrent_settings_are_rejected_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.d_model=128", "model.mixers=[mamba2, muonssm_gated_deltanet, deltanet]", override])


def test_flops_entries_follow_the_documented_formulas():
    cfg = config()
    heads, head_dim, state, chunk = 2, 32, 8, 16  # mamba2: expand 2 -> 64 channels in 2 heads
    ssd = 2 * chunk * (state + head_dim) + 4 * state * head_dim
    projections = 2 * 32 * (2 * 64 + 2 * state + heads) + 2 * 64 * 32 + 2 * 4 * (64 + 2 * state)
    assert mixer_flops_per_token("mamba2", cfg, 256) == projections + heads * ssd
    momentum_ssd = 2 * chunk**2 + 2 * chunk + 2 * chunk * (state + head_dim) + 8 * state * head_dim
    assert mixer_flops_per_token("muonssm_mamba2", cfg, 256) == projections + heads * momentum_ssd
    no_momentum = dataclasses.replace(cfg, muonssm=MuonSSMConfig(gamma=0.0))
    for name, backbone in (("muonssm_mamba2", "mamba2"), ("muonssm_gated_deltanet", "gated_deltanet")):
        assert mixer_flops_per_token(name, no_momentum, 256) == mixer_flops_per_token(backbone, cfg, 256)
    assert mixer_flops_per_token("gated_deltanet", cfg, 256) > mixer_flops_per_token("deltanet", cfg, 256)


def _reference_gated_rms_norm(y, z, weight, eps, group_size):
    """state-spaces/mamba ``RMSNormGated(norm_before_gate=False)``: normalise ``y * silu(z)`` per group."""
    gated = y * z / (1 + np.exp(-z))
    groups = gated.reshape(*gated.shape[:-1], -1, group_size)
    normed = groups / np.sqrt(np.mean(groups**2, axis=-1, keepdims=True) + eps)
    return normed.reshape(gated.shape) * weight


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mamba2", "muonssm_mamba2"])
def test_mamba2_output_norm_is_the_reference_gate_then_one_group_rms_norm(name):
    mixer = build_mixer(name, config(), nnx.Rngs(7))
    heads, head_dim = mixer.heads, mixer.head_dim
    assert mixer.norm.scale.get_value().shape == (heads * head_dim,)  # one scale over all heads
    weight = jax.random.uniform(jax.random.key(8), (heads * head_dim,), minval=0.5, maxval=1.5)
    mixer.norm.scale.set_value(weight)
    y, z = (jax.random.normal(jax.random.key(s), (2, 5, heads, head_dim)) for s in (9, 10))
    expected = _reference_gated_rms_norm(np.asarray(y).reshape(2, 5, -1), np.asarray(z).reshape(2, 5, -1),
                                         np.asarray(weight), mixer.norm.eps, heads * head_dim)
    np.testing.assert_allclose(mixer.gated_norm(y, z).reshape(2, 5, -1), expected, rtol=1e-5, atol=1e-5)
    # The earlier rule (norm per head, then gate) stays an option, with a [P] scale, and differs.
    per_head = config(mamba2=Mamba2Config(state_dim=8, chunk_size=16, gated_norm="per_head_before_gate"))
    old = build_mixer(name, per_head, nnx.Rngs(7))
    assert old.norm.scale.get_value().shape == (head_dim,)
    x = inputs(seed=11)
    assert not np.allclose(forward(old, x, None), forward(mixer, x, None), atol=1e-2)


def test_unknown_mamba2_gated_norm_is_rejected_naming_the_field():
    with pytest.raises(ConfigError, match=r"model.mamba2.gated_norm: must be after_gate or per_head_before_gate"):
        load_config(None, ["model.d_model=128", "model.mamba2.gated_norm=before"])


def _explicit_newton_schulz(matrix, steps):
    from pallas_kernels.newton_schulz import newton_schulz
    return newton_schulz(matrix, steps=steps, impl="xla")


@pytest.mark.parametrize("steps", [1, 3])
def test_muonssm_all_scope_conditions_the_all_heads_injection_as_one_matrix(steps):
    heads, state, head_dim = 2, 3, 4
    mixer = build_mixer("muonssm_mamba2", config(muonssm=MuonSSMConfig(ns_steps=steps)), nnx.Rngs(0))
    assert mixer.ns_scope == "all"  # the MuonSSM code's scope is the default
    key = jax.random.normal(jax.random.key(1), (state,))  # B_t, shared by the heads
    values = jax.random.normal(jax.random.key(2), (heads, head_dim)) * jnp.array([[1.0], [4.0]])  # Delta x
    stacked = values.reshape(-1)[:, None] * key[None, :]  # the [H P, N] injection of the MuonSSM code
    sum_squares = jnp.sum(key**2) * jnp.sum(values**2, -1)
    scale = mixer.injection_scale(sum_squares[None, None], shared_key=True)[0, 0]
    np.testing.assert_allclose(jnp.repeat(scale, head_dim)[:, None] * stacked,
                               _explicit_newton_schulz(stacked, steps), atol=2e-5)
    # Gated DeltaNet: heads own their keys; the all-heads injection is block-diagonal.
    keys = jax.random.normal(jax.random.key(3), (heads, state))
    blocks = [keys[h][:, None] * values[h][None, :] for h in range(heads)]
    block_diagonal = jax.scipy.linalg.block_diag(*blocks)
    sums = jnp.sum(keys**2, -1) * jnp.sum(values**2, -1)
    scales = mixer.injection_scale(sums[None, None], shared_key=False)[0, 0]
    np.testing.assert_allclose(jax.scipy.linalg.block_diag(*[scales[h] * blocks[h] for h in range(heads)]),
                               _explicit_newton_schulz(block_diagonal, steps), atol=2e-5)


@pytest.mark.parametrize("name", ["muonssm_mamba2", "muonssm_gated_deltanet"])
def test_muonssm_head_scope_is_the_per_head_rule_and_differs_from_all(name):
    per_head = build_mixer(name, config(muonssm=MuonSSMConfig(ns_scope="head")), nnx.Rngs(5))
    every = build_mixer(name, config(), nnx.Rngs(5))
    sums = jnp.array([[[1.0, 9.0]]])
    from pallas_kernels.momentum_scan import rank_one_scale
    np.testing.assert_allclose(per_head.injection_scale(sums, shared_key=True), rank_one_scale(sums, steps=1))
    x = inputs(seed=12)
    assert not np.allclose(forward(per_head, x, None), forward(every, x, None), atol=1e-4)
