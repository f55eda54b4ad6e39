"""model.scan_layers: the repeated group of mixers as one scanned body equals the unrolled model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.models import build_model, generate
from seqmodels.models.stack import repeat_period, unstack_blocks
from seqmodels.sharding import param_logical_axes

# float32: the scanned and unrolled programs run the same operations; XLA may fuse them differently.
TOL = 1e-6


def configs(mixers, **extra):
    base = ModelConfig(d_model=32, num_heads=2, vocab_size=40, max_seq_len=32, mixers=mixers, kernel_impl="xla",
                       **extra)
    return base, dataclasses.replace(base, scan_layers=True)


def batch(seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (2, 17), 0, 40)
    segments = jnp.asarray([[1] * 10 + [2] * 7, [1] * 17])
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": segments[:, :-1],
            "loss_mask": jnp.ones((2, 16), jnp.float32)}


def test_the_repeat_period_is_the_shortest_repeated_group():
    assert repeat_period(["a", "b", "a", "b"]) == 2
    assert repeat_period(["g", "g", "x"] * 8) == 3
    assert repeat_period(["a"] * 6) == 1
    assert repeat_period(["a", "b", "c"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("mixers, remat", [(("gated_deltanet", "attention") * 2, "none"),
                                           (("attention",) * 3, "full")])
def test_scanned_layers_hold_the_unrolled_parameters_and_give_the_same_loss_and_gradients(mixers, remat):
    unrolled_config, scanned_config = configs(mixers, remat=remat)
    unrolled, scanned = build_model(unrolled_config, seed=3), build_model(scanned_config, seed=3)
    scanned_params = nnx.to_pure_dict(nnx.state(scanned, nnx.Param))
    unrolled_params = nnx.to_pure_dict(nnx.state(unrolled, nnx.Param))
    repeats = len(mixers) // repeat_period(mixers)
    jax.tree.map(np.testing.assert_array_equal, unstack_blocks(scanned_params, repeats), unrolled_params)
    axes = param_logical_axes(nnx.state(scanned, nnx.Param))
    assert all(a[0] == "layers" for a in jax.tree.leaves(axes["stack"], is_leaf=lambda x: isinstance(x, tuple)))

    def loss_and_grads(model):
        return nnx.value_and_grad(lambda m: m.loss(batch())[0])(model)

    (loss_u, grads_u), (loss_s, grads_s) = nnx.jit(loss_and_grads)(unrolled), nnx.jit(loss_and_grads)(scanned)
    np.testing.assert_allclose(loss_s, loss_u, rtol=TOL)
    grads_s = unstack_blocks(nnx.to_pure_dict(grads_s), repeats)
    # float32 summation order: entries agree to ~1e-7 of the gradient's scale (its largest entry); a
    # tiny entry can then differ by 1e-4 of itself, so the bound is relative to that scale.
    grads_u = nnx.to_pure_dict(grads_u)
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads_u))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale), grads_s, grads_u)


@pytest.mark.slow
def test_scanned_layers_decode_the_same_tokens():
    unrolled_config, scanned_config = configs(("gated_deltanet", "attention") * 2)
    prompt = jax.random.randint(jax.random.key(1), (2, 5), 0, 40)
    tokens_u, logits_u = generate(build_model(unrolled_config, seed=4), prompt, 6)
    tokens_s, logits_s = generate(build_model(scanned_config, seed=4), prompt, 6)
    np.testing.assert_array_equal(tokens_s, tokens_u)
    np.testing.assert_allclose(logits_s, logits_u, rtol=1e-5, atol=1e-5)


def test_scanned_muon_orthogonalises_each_stacked_matrix_on_its_own():
    from seqmodels.optim.build import _matrix_shape
    assert _matrix_shape(("layers", "embed", "heads", "head_dim"), (4, 32, 2, 16)) == (4, 32, 32)
    assert _matrix_shape(("heads", "head_dim", "embed"), (2, 16, 32)) == (32, 32)
