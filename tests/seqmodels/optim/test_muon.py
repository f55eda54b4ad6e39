"""Muon: orthogonalised matrix updates, AdamW elsewhere, sharding-invariant, and it trains."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from seqmodels.optim import default_muon_mask, muon
from seqmodels.optim.muon import path_name

LR = 0.1


def _normal(seed, shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


def _params():
    return {
        "embed": {"embedding": _normal(0, (50, 32))},
        "layers": {
            "mlp": {"w": _normal(1, (32, 64)), "w_out": _normal(5, (64, 32)), "bias": jnp.zeros(64)},
            "attn": {"q": _normal(2, (32, 64))},
            "stacked": _normal(3, (6, 64, 32)),
            "norm": {"scale": jnp.ones(32)},
        },
        "lm_head": {"kernel": _normal(4, (32, 50))},
    }


def _grads(params, seed=10):
    leaves, tree = jax.tree.flatten(params)
    return jax.tree.unflatten(tree, [_normal(seed + i, p.shape) for i, p in enumerate(leaves)])


def _first_update(tx, grads, params):
    """The first update of ``tx`` (init + update under one jit)."""
    return jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)


def _singular_values(matrix):
    return np.linalg.svd(np.asarray(matrix, np.float64), compute_uv=False)


def test_default_mask_sends_matrices_to_muon_and_embeddings_norms_biases_heads_to_adamw():
    params = _params()
    chosen = jax.tree_util.tree_map_with_path(
        lambda path, p: default_muon_mask("/".join(str(k.key) for k in path), p), params
    )
    assert chosen["layers"]["mlp"]["w"] and chosen["layers"]["attn"]["q"] and chosen["layers"]["stacked"]
    assert not chosen["embed"]["embedding"] and not chosen["lm_head"]["kernel"]
    assert not chosen["layers"]["mlp"]["bias"]
    assert not chosen["layers"]["norm"]["scale"]


def test_paths_join_keys_and_drop_the_value_attribute_of_nnx_variables():
    keys = jax.tree_util
    path = (keys.DictKey("layers"), keys.SequenceKey(0), keys.DictKey("kernel"), keys.GetAttrKey("value"))
    assert path_name(path) == "layers/0/kernel"
    assert path_name((keys.DictKey("value"),)) == "value"


def test_update_of_a_matrix_has_near_equal_singular_values():
    params, grads = _params(), _grads(_params())
    weight = params["layers"]["mlp"]["w"]
    gradient_singular = _singular_values(grads["layers"]["mlp"]["w"])
    assert gradient_singular.max() / gradient_singular.min() > 4
    # 8 Polar Express steps in fp32 converge (singular values within 1% of 1).
    tx = muon(LR, ns_steps=8, ns_coefficients="polar_express", ns_dtype=jnp.float32)
    updates = _first_update(tx, grads, params)
    singular = _singular_values(updates["layers"]["mlp"]["w"]) / (LR * 0.2 * np.sqrt(64))
    np.testing.assert_allclose(singular, 1.0, atol=1e-2)
    # Default: 5 muon steps in bf16 keep singular values in the quintic's band (about [0.68, 1.13]
    # for normalised singular values >= 1e-2; bf16 widens it by ~2%); every stack entry alike.
    updates = _first_update(muon(LR), grads, params)
    for matrix in [updates["layers"]["mlp"]["w"], *updates["layers"]["stacked"]]:
        singular = _singular_values(matrix) / (LR * 0.2 * np.sqrt(64))
        assert singular.min() > 0.6 and singular.max() < 1.16
    assert np.all(np.asarray(updates["layers"]["mlp"]["w"]) != np.asarray(-LR * 0.2 * weight))


def test_matrices_of_one_shape_batched_together_are_orthogonalised_independently():
    params, grads = _params(), _grads(_params())
    tx = muon(LR, ns_dtype=jnp.float32)
    together = _first_update(tx, grads, params)  # mlp/w_out [64, 32] joins the 6 stacked [64, 32]
    weight, grad = params["layers"]["mlp"]["w_out"], grads["layers"]["mlp"]["w_out"]
    alone = _first_update(tx, {"w_out": grad}, {"w_out": weight})
    np.testing.assert_allclose(together["layers"]["mlp"]["w_out"], alone["w_out"], atol=1e-6, rtol=0)


def test_per_head_split_orthogonalises_each_head_block():
    params, grads = _params(), _grads(_params())
    per_head = lambda path, p: (-1, 4) if path == "layers/attn/q" else None
    tx = muon(LR, ns_steps=8, ns_coefficients="polar_express", ns_dtype=jnp.float32, per_head=per_head)
    updates = _first_update(tx, grads, params)
    blocks = jnp.split(updates["layers"]["attn"]["q"], 4, axis=-1)  # 4 heads of [32, 16]
    for block in blocks:
        np.testing.assert_allclose(_singular_values(block) / (LR * 0.2 * np.sqrt(32)), 1.0, atol=1e-2)
    whole = _singular_values(updates["layers"]["attn"]["q"])
    assert whole.max() / whole.min() > 1.1  # the concatenation of orthogonal heads is not orthogonal


def test_adamw_group_matches_optax_adamw_with_the_same_hyperparameters():
    params = _params()
    tx = muon(LR, weight_decay=0.1, adam_b1=0.8, adam_b2=0.9, adam_eps=1e-6)
    reference = optax.adamw(LR, b1=0.8, b2=0.9, eps=1e-6, weight_decay=0.1)
    state, reference_state = tx.init(params), reference.init(params)
    update, reference_update = jax.jit(tx.update), jax.jit(reference.update)
    for step in range(3):
        grads = _grads(params, seed=20 + 10 * step)
        updates, state = update(grads, state, params)
        expected, reference_state = reference_update(grads, reference_state, params)
        for path in [("embed", "embedding"), ("lm_head", "kernel"), ("layers", "norm", "scale")]:
            actual_leaf, expected_leaf = updates, expected
            for key in path:
                actual_leaf, expected_leaf = actual_leaf[key], expected_leaf[key]
            np.testing.assert_allclose(actual_leaf, expected_leaf, rtol=1e-6, atol=1e-9)
        params = optax.apply_updates(params, updates)


def test_learning_rate_may_be_a_schedule():
    params = {"w": _normal(1, (16, 24))}
    grads = {"w": _normal(2, (16, 24))}
    tx = muon(lambda step: 0.1 * (step + 1), ns_dtype=jnp.float32)
    update = jax.jit(tx.update)
    first, state = update(grads, tx.init(params), params)
    second, _ = update(grads, state, params)
    # Same gradient twice: the momentum only rescales, NS normalises it away, so only lr changes.
    np.testing.assert_allclose(second["w"], 2 * first["w"], rtol=1e-4, atol=1e-7)


def test_muon_mask_overrides_and_rejects_vectors():
    params, grads = _params(), _grads(_params())
    only_stacked = lambda path, p: path == "layers/stacked"
    updates = _first_update(muon(LR, muon_mask=only_stacked), grads, params)
    adamw = _first_update(optax.adamw(LR, b1=0.9, b2=0.95, weight_decay=0.0), grads, params)
    np.testing.assert_allclose(updates["layers"]["mlp"]["w"], adamw["layers"]["mlp"]["w"], rtol=1e-6)
    tree_mask = jax.tree.map(lambda p: False, params)
    with pytest.raises(ValueError, match=r"muon_mask selects 'layers/mlp/bias' of shape \(64,\)"):
        muon(LR, muon_mask=lambda path, p: path == "layers/mlp/bias").init(params)
    assert muon(LR, muon_mask=tree_mask).init(params) is not None
    with pytest.raises(ValueError, match="momentum must be in"):
        muon(LR, momentum=1.0)
    with pytest.raises(ValueError, match="per_head.*must give"):
        five_heads = lambda path, p: (-1, 5) if path == "layers/attn/q" else None
        _first_update(muon(LR, per_head=five_heads), grads, params)


@pytest.mark.slow
@pytest.mark.parametrize(("ns_impl", "axis_type"), [("pallas", AxisType.Explicit), ("xla", AxisType.Auto)])
def test_sharded_update_under_jit_equals_the_unsharded_update(ns_impl, axis_type):
    params = _params()
    specs = {
        "embed": {"embedding": PartitionSpec(None, "tensor")},
        "layers": {
            "mlp": {
                "w": PartitionSpec("fsdp", "tensor"),
                "w_out": PartitionSpec("tensor", "fsdp"),
                "bias": PartitionSpec("tensor"),
            },
            "attn": {"q": PartitionSpec("fsdp", "tensor")},
            "stacked": PartitionSpec("data", "fsdp", "tensor"),
            "norm": {"scale": PartitionSpec("fsdp")},
        },
        "lm_head": {"kernel": PartitionSpec("fsdp", "tensor")},
    }
    per_head = lambda path, p: (-1, 4) if path == "layers/attn/q" else None
    tx = muon(LR, weight_decay=0.1, ns_dtype=jnp.float32, ns_impl=ns_impl, per_head=per_head)
    grads = [_grads(params, seed) for seed in (30, 40)]

    def two_steps(params, grads):
        state = tx.init(params)
        for g in grads:
            updates, state = tx.update(g, state, params)
        return updates

    expected = jax.jit(two_steps)(params, grads)
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(axis_type,) * 3)
    with jax.set_mesh(mesh):
        place = lambda tree: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)
        actual = jax.jit(two_steps)(place(params), [place(g) for g in grads])
    assert actual["layers"]["stacked"].sharding.spec == specs["layers"]["stacked"]
    # fp32 NS; the same per-matrix arithmetic on every device, batched differently: ~1e-7 apart.
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, atol=2e-6, rtol=0), actual, expected)


def test_two_layer_mlp_regression_trains():
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    inputs = jax.random.normal(keys[0], (256, 8))
    targets = jnp.sin(inputs @ jax.random.normal(keys[1], (8, 1)))
    params = {
        "hidden": {"w": jax.random.normal(keys[2], (8, 32)) / jnp.sqrt(8), "bias": jnp.zeros(32)},
        "out": {"w": jax.random.normal(keys[3], (32, 1)) / jnp.sqrt(32), "bias": jnp.zeros(1)},
    }

    def loss_fn(params):
        hidden = jnp.tanh(inputs @ params["hidden"]["w"] + params["hidden"]["bias"])
        return jnp.mean((hidden @ params["out"]["w"] + params["out"]["bias"] - targets) ** 2)

    tx = muon(optax.cosine_decay_schedule(0.05, 150))

    @jax.jit
    def train(params):
        def step(carry, _):
            params, state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, state = tx.update(grads, state, params)
            return (optax.apply_updates(params, updates), state), loss

        (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), length=150)
        return losses, loss_fn(params)

    losses, final = train(params)
    assert np.all(np.isfinite(losses))
    assert final < 0.2 * losses[0], (float(losses[0]), float(final))


@pytest.mark.parametrize("impl", ["xla", "pallas_tpu"])
def test_optim_muon_impl_is_the_newton_schulz_impl_of_every_muon_update(impl, monkeypatch):
    """``optim.muon_impl`` reaches every Newton-Schulz call, and the update it gives (``pallas_tpu``:
    the Mosaic kernel in interpret mode) is the fp32 reference iteration's.

    The comparison runs every implementation on fp32 operands (each call's input upcast, so all see
    the same matrices): fp32 rounding (2^-24 per operation) grows by at most the quintic's slope
    a = 3.4445 per step, 3.4445^5 * 2^-24 < 3e-5 of the largest entry after 5 steps.
    """
    import importlib

    from seqmodels.config import OptimConfig
    from seqmodels.optim.build import build_optimizer

    seen = []
    muon_module = importlib.import_module("seqmodels.optim.muon")  # the package re-exports the function `muon`
    real = muon_module.newton_schulz

    def fp32_newton_schulz(x, **kw):
        seen.append(kw["impl"])
        return real(x.astype(jnp.float32), **kw)

    monkeypatch.setattr(muon_module, "newton_schulz", fp32_newton_schulz)
    params = {"mlp": {"w": _normal(1, (32, 64))}, "head": {"kernel": _normal(2, (32, 50))}}
    axes = {"mlp": {"w": ("embed", "mlp")}, "head": {"kernel": ("embed", "vocab")}}
    shapes = jax.tree.map(lambda p: tuple(p.shape), params)

    def first_update(muon_impl):
        tx, _ = build_optimizer(OptimConfig(name="muon", muon_impl=muon_impl, warmup_steps=0), 10,
                                param_axes=axes, param_shapes=shapes)
        return _first_update(tx, _grads(params), params)["mlp"]["w"]

    actual = first_update(impl)
    assert seen and set(seen) == {impl}
    expected = first_update("reference")
    assert set(seen) == {impl, "reference"}
    np.testing.assert_allclose(actual, expected, atol=3e-5 * float(jnp.max(jnp.abs(expected))), rtol=0)
