"""The looped padded transformer: loop and padding rule, shared weights, gradients, read-out, memory."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.config_looped import LoopedConfig
from seqmodels.data.cfl import sample
from seqmodels.data.cfl.rows import ACCEPT_ID, REJECT_ID, VOCAB_SIZE, labelled_batch
from seqmodels.layers.rotary import sinusoidal_positions
from seqmodels.models import build_model, flops_per_token
from seqmodels.models.looped import LoopedModel, num_loops, num_padding, parameter_count

# float32 on CPU: the paths compared differ only in summation order (batch padding, masked rows),
# far below 1e-5 on logits of size ~1.
FP32_TOL = 1e-5


@nnx.jit
def forward(model, tokens, segment_ids=None):
    return model(tokens, segment_ids=segment_ids)


@nnx.jit
def hidden_states(model, tokens):
    return model.hidden(tokens)[0]


@nnx.jit
def loss_and_grad(model, batch):
    return nnx.value_and_grad(lambda model: model.loss(batch)[0])(model)


def looped_config(**looped) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB_SIZE, d_model=32, num_heads=2, kind="looped",
                       looped=LoopedConfig(**looped))


def mixed_length_batch(lengths=(4, 10, 6), language="dyck1", seed=0):
    """One dyck1 example per requested length, all in rows of max(lengths) + 2 tokens."""
    examples = [sample(language, 1, n, seed + i)[0] for i, n in enumerate(lengths)]
    batch = labelled_batch(language, examples, seq_len=max(lengths) + 2)
    return {key: jnp.asarray(value) for key, value in batch.items()}


def test_loop_count_and_padding_follow_the_rule():
    log = LoopedConfig(loops_scale=1.0, loops_offset=1)
    assert [num_loops(log, n) for n in (1, 2, 3, 16, 17, 32, 33, 128)] == [1, 2, 3, 5, 6, 6, 7, 8]
    assert [num_loops(LoopedConfig(loops_scale=1.5, loops_offset=0), n) for n in (1, 4, 5)] == [1, 3, 4]
    assert num_loops(LoopedConfig(loop_schedule="fixed", fixed_loops=7), 1000) == 7
    assert [num_padding(LoopedConfig(padding_scale=1.0), n) for n in (0, 5, 32)] == [0, 5, 32]
    assert [num_padding(LoopedConfig(padding_scale=0.5, padding_exponent=2.0), n) for n in (3, 4)] == [5, 8]
    assert num_padding(LoopedConfig(padding_scale=0.0, padding_exponent=3.0), 100) == 0


def test_batch_layout_places_padding_and_cls_by_the_rule():
    config = looped_config(padding_scale=0.5, padding_exponent=1.0)
    model = build_model(config)
    batch = mixed_length_batch((4, 10, 6))
    layout = model.layout(batch["inputs"], batch["segment_ids"])
    assert layout["length"].tolist() == [4, 10, 6]
    assert layout["padding"].tolist() == [2, 5, 3]
    assert layout["loops"].tolist() == [num_loops(config.looped, n) for n in (4, 10, 6)]
    assert layout["readout"].tolist() == [4 + 2 + 1, 10 + 5 + 1, 6 + 3 + 1]
    hidden = jax.eval_shape(lambda: model.hidden(batch["inputs"], batch["segment_ids"])[0])
    assert hidden.shape == (3, 12 + num_padding(config.looped, 10), 32)


@pytest.mark.slow
def test_looped_model_runs_exactly_loops_n_iterations():
    """The log-schedule model equals the same weights run a fixed loops(N) times, and differs at loops(N) +- 1."""
    config = looped_config(padding_scale=1.0)
    model = build_model(config, seed=3)
    batch = mixed_length_batch((12,))
    logits = forward(model, batch["inputs"], batch["segment_ids"])
    loops = num_loops(config.looped, 12)
    graphdef_params = nnx.state(model, nnx.Param)
    for fixed in (loops - 1, loops, loops + 1):
        fixed_config = dataclasses.replace(
            config, looped=dataclasses.replace(config.looped, loop_schedule="fixed", fixed_loops=fixed))
        fixed_model = build_model(fixed_config, seed=99)
        nnx.update(fixed_model, graphdef_params)
        fixed_logits = forward(fixed_model, batch["inputs"], batch["segment_ids"])
        same = np.allclose(logits, fixed_logits, atol=FP32_TOL)
        assert same == (fixed == loops), fixed


def abstract_model(**looped):
    return nnx.eval_shape(lambda: build_model(looped_config(**looped)))


def test_shared_weights_are_one_set_whatever_the_loop_count():
    counts = {loops: parameter_count(abstract_model(loop_schedule="fixed", fixed_loops=loops)) for loops in (1, 4, 30)}
    assert counts[1] == counts[4] == counts[30]
    assert parameter_count(abstract_model(loops_offset=9)) == counts[1]
    model = abstract_model(loop_schedule="fixed", fixed_loops=30)
    assert len(model.blocks) == 1
    block = parameter_count(model.blocks[0])
    distinct = {loops: parameter_count(abstract_model(loop_schedule="fixed", fixed_loops=loops, share_weights=False))
                for loops in (1, 4)}
    assert distinct[1] == counts[1] and distinct[4] == counts[1] + 3 * block


@pytest.mark.slow
def test_gradient_of_the_shared_block_sums_the_gradients_of_every_loop():
    """Unrolled into 4 distinct copies of the shared block: each copy gets a gradient; they sum to the shared one."""
    loops = 4
    shared = build_model(looped_config(loop_schedule="fixed", fixed_loops=loops), seed=5)
    unrolled = build_model(looped_config(loop_schedule="fixed", fixed_loops=loops, share_weights=False), seed=6)
    shared_params = nnx.to_pure_dict(nnx.state(shared, nnx.Param))
    unrolled_params = nnx.to_pure_dict(nnx.state(unrolled, nnx.Param))
    for name in ("embed", "pad_embedding", "prelude", "coda", "final_norm"):
        unrolled_params[name] = shared_params[name]
    unrolled_params["blocks"] = {i: shared_params["blocks"][0] for i in range(loops)}
    state = nnx.state(unrolled, nnx.Param)
    nnx.replace_by_pure_dict(state, unrolled_params)
    nnx.update(unrolled, state)
    batch = mixed_length_batch((6, 8))

    shared_loss, shared_grad = loss_and_grad(shared, batch)
    unrolled_loss, unrolled_grad = loss_and_grad(unrolled, batch)
    np.testing.assert_allclose(shared_loss, unrolled_loss, rtol=FP32_TOL)
    shared_grad = nnx.to_pure_dict(shared_grad)["blocks"][0]
    per_loop = nnx.to_pure_dict(unrolled_grad)["blocks"]
    for i in range(loops):  # the gradient reaches every iteration, the first included
        assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(per_loop[i])), i
    summed = jax.tree.map(lambda *g: sum(g), *(per_loop[i] for i in range(loops)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), shared_grad, summed)


@pytest.mark.slow
@pytest.mark.parametrize("attention, padding_scale, positions", [
    ("causal", 1.5, "rope"), ("bidirectional", 0.0, "rope"), ("causal", 1.0, "rope+sinusoidal")])
def test_read_out_of_a_mixed_length_batch_equals_each_example_alone(attention, padding_scale, positions):
    config = looped_config(attention=attention, padding_scale=padding_scale, positions=positions)
    model = build_model(config, seed=7)
    lengths = (4, 10, 2)
    batch = mixed_length_batch(lengths)
    batched = forward(model, batch["inputs"], batch["segment_ids"])
    for row, n in enumerate(lengths):
        alone = forward(model, batch["inputs"][row:row + 1, :n + 2])  # exactly [BOS] w [CLS]: nothing empty
        np.testing.assert_allclose(batched[row], alone[0], atol=FP32_TOL, rtol=FP32_TOL)


def test_loss_is_the_cross_entropy_of_the_label_between_reject_and_accept_only():
    model = build_model(looped_config(), seed=3)
    batch = mixed_length_batch((4, 10, 6))
    logits = np.asarray(forward(model, batch["inputs"], batch["segment_ids"]))
    rows = np.arange(3)
    labels = np.asarray(batch["targets"])[rows, [5, 11, 7]]  # the target at [CLS], position N + 1
    assert set(labels) <= {ACCEPT_ID, REJECT_ID}
    pair = logits[:, [REJECT_ID, ACCEPT_ID]]
    log_probs = pair - np.log(np.exp(pair).sum(axis=1, keepdims=True))
    expected = -log_probs[rows, (labels == ACCEPT_ID).astype(int)].sum()
    loss_sum, weight = nnx.jit(lambda model, batch: model.loss(batch))(model, batch)
    assert float(weight) == 3.0
    # The other 24 logits play no part: a full-vocabulary softmax would add log-sum-exp mass over them.
    np.testing.assert_allclose(float(loss_sum), expected, rtol=FP32_TOL)


def test_causal_attention_hides_later_symbols_and_bidirectional_does_not():
    batch = mixed_length_batch((8,))
    changed = batch["inputs"].at[0, 6].set(batch["inputs"][0, 6] ^ 1)  # '(' <-> ')' (ids 12, 13)
    for attention, sees_future in (("causal", False), ("bidirectional", True)):
        model = build_model(looped_config(attention=attention), seed=1)
        before, after = hidden_states(model, batch["inputs"]), hidden_states(model, changed)
        assert np.allclose(before[:, :6], after[:, :6], atol=FP32_TOL) != sees_future, attention


def test_empty_positions_do_not_change_the_read_out():
    model = build_model(looped_config(padding_scale=1.0), seed=2)
    batch = mixed_length_batch((4, 10))
    noisy = batch["inputs"].at[0, 7:].set(15)  # row 0 holds 6 tokens; fill its empty positions
    np.testing.assert_allclose(forward(model, batch["inputs"], batch["segment_ids"]),
                               forward(model, noisy, batch["segment_ids"]), atol=FP32_TOL)


def test_sinusoidal_positions_add_the_position_features_to_every_padded_position():
    plain = build_model(looped_config(padding_scale=1.0), seed=4)
    config = looped_config(padding_scale=1.0, positions="rope+sinusoidal")
    model = build_model(config, seed=4)
    assert parameter_count(model) == parameter_count(plain)  # fixed features, no parameters
    batch = mixed_length_batch((4, 6))
    layouts = [m.layout(batch["inputs"], batch["segment_ids"]) for m in (plain, model)]
    (x_plain, valid), (x, _) = (m._embed_padded(batch["inputs"], lay) for m, lay in zip((plain, model), layouts))
    assert x.shape == x_plain.shape == (2, 8 + 6, 32)  # L + P(L - 2) positions
    features = sinusoidal_positions(jnp.arange(x.shape[1]), 32, config.attention.rope_theta)
    np.testing.assert_allclose(x - x_plain, np.broadcast_to(np.sqrt(2) * config.init_std * features, x.shape),
                               atol=1e-6)


def test_flops_count_every_block_on_every_padded_position():
    config = looped_config(padding_scale=1.0, attention="bidirectional", prelude_layers=1, coda_layers=2)
    model = build_model(config)
    seq_len = 18
    padded = seq_len + num_padding(config.looped, 16)
    blocks = 1 + num_loops(config.looped, 16) + 2
    params = nnx.to_pure_dict(nnx.state(model.blocks[0], nnx.Param))
    matmul_params = sum(leaf.size for leaf in jax.tree.leaves(params) if leaf.ndim >= 2)
    per_position = 2 * matmul_params + 4 * config.d_model * padded  # scores and values: 4 H Dh T
    expected = (blocks * padded * per_position + 2 * config.d_model * VOCAB_SIZE) / seq_len
    assert flops_per_token(config, seq_len) == pytest.approx(expected)
    assert model.flops_per_token(seq_len) == pytest.approx(expected)


@pytest.mark.parametrize("looped, message", [
    (dict(prelude_layers=3), "model.looped.prelude_layers"),
    (dict(share_weights=False), "model.looped.share_weights"),
    (dict(attention="sideways"), "model.looped.attention"),
    (dict(padding_scale=-1.0), "model.looped.padding_scale"),
    (dict(positions="learned"), "model.looped.positions"),
])
def test_bad_looped_config_is_refused_naming_the_key(looped, message):
    with pytest.raises(ConfigError, match=message):
        looped_config(**looped)


def test_sinusoidal_positions_need_an_even_width():
    with pytest.raises(ConfigError, match="model.looped.positions"):
        ModelConfig(vocab_size=VOCAB_SIZE, d_model=33, num_heads=1, kind="looped",
                    looped=LoopedConfig(positions="rope+sinusoidal"))


def test_build_model_dispatches_on_kind():
    assert isinstance(build_model(looped_config()), LoopedModel)
    with pytest.raises(ConfigError, match="model.kind"):
        ModelConfig(kind="recurrent")


def grad_step_temp_bytes(loops: int, remat: str, batch_size: int, row_length: int) -> int:
    """Scratch memory XLA plans for one gradient of the loss (compiled, not run)."""
    config = dataclasses.replace(looped_config(loop_schedule="fixed", fixed_loops=loops), remat=remat)
    graphdef, params = nnx.split(build_model(config))
    batch = {"inputs": jnp.ones((batch_size, row_length), jnp.int32),
             "targets": jnp.ones((batch_size, row_length), jnp.int32),
             "loss_mask": jnp.ones((batch_size, row_length), jnp.float32),
             "segment_ids": jnp.ones((batch_size, row_length), jnp.int32)}

    def loss(params, batch):
        return nnx.merge(graphdef, params).loss(batch)[0]

    compiled = jax.jit(jax.grad(loss)).lower(params, batch).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_memory_stays_flat_in_the_loop_count_with_remat_per_iteration():
    """4 -> 32 loops adds one saved residual stream [B, T, D] per extra loop with remat, the block's
    activations (scores [B, H, T, T], MLP hidden [B, T, F]) per extra loop without."""
    batch_size, row_length, d_model = 8, 128, 32
    residual_bytes = batch_size * row_length * d_model * 4
    remat_4 = grad_step_temp_bytes(4, "full", batch_size, row_length)
    remat_32 = grad_step_temp_bytes(32, "full", batch_size, row_length)
    plain_32 = grad_step_temp_bytes(32, "none", batch_size, row_length)
    assert remat_32 - remat_4 <= 1.25 * 28 * residual_bytes  # measured: 1.0 x (3.7 MB on 9.4 MB)
    assert remat_32 < 1.6 * remat_4
    assert plain_32 > 10 * remat_32  # measured: 227 MB against 13 MB


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["gated_deltanet", "mamba2"])
def test_the_looped_block_takes_any_registered_mixer(mixer):
    """A looped Gated DeltaNet (or Mamba2) is configuration: its block is the mixer, its rows stay separate."""
    config = dataclasses.replace(looped_config(mixer=mixer, attention="causal", padding_scale=1.0), kernel_impl="xla")
    model = build_model(config, seed=5)
    assert type(model.blocks[0].mixer).__name__ == {"gated_deltanet": "DeltaNet", "mamba2": "Mamba2"}[mixer]
    lengths = (4, 10, 2)
    batch = mixed_length_batch(lengths)
    batched = forward(model, batch["inputs"], batch["segment_ids"])
    for row, n in enumerate(lengths):
        alone = forward(model, batch["inputs"][row:row + 1, :n + 2])
        np.testing.assert_allclose(batched[row], alone[0], atol=FP32_TOL, rtol=FP32_TOL)
    _, grads = loss_and_grad(model, batch)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(nnx.state(grads.blocks[0].mixer, nnx.Param)))


def test_an_unknown_looped_mixer_and_a_bidirectional_sliding_window_are_refused():
    with pytest.raises(ConfigError, match="model.looped.mixer: unknown mixer 'lstm'"):
        build_model(looped_config(mixer="lstm"))
    with pytest.raises(ConfigError, match="the sliding-window mixer \\(swa\\) is causal only"):
        build_model(looped_config(mixer="swa", attention="bidirectional"))
    with pytest.raises(ConfigError, match="model.attention.causal: false .* a decoder LM must be causal"):
        ModelConfig(attention=dataclasses.replace(ModelConfig().attention, causal=False))
