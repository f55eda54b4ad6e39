"""AHN (seqmodels/models/ahn.py): eviction alignment, zero-init equivalence, streaming decode, config errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.config_ahn import AHNConfig
from seqmodels.mixers.attention import SlidingWindowConfig
from seqmodels.models import build_model, generate
from seqmodels.models.ahn_compressor import COMPRESSORS
from tests.seqmodels.models.ahn_fixtures import ahn_model, tokens, write_tiny_base

COMPRESSOR_NAMES = sorted(COMPRESSORS)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return write_tiny_base(tmp_path_factory.mktemp("ahn") / "base")


def oracle_memory(compressor, h, q, k, v, *, ring: int, sinks: int) -> np.ndarray:
    """Token by token, from scratch for every query t: the state of the tokens sinks..t-ring, written in order
    by the rule's equations (numpy float64), read with q_t; then the module's own gated read-out."""
    qn, kn, vn = (np.asarray(a, np.float64) for a in compressor.features(q, k, v))
    strength, log_decay = (np.asarray(a, np.float64) for a in compressor.write_gates(h))
    batch, length, heads, dim = qn.shape
    reads = np.zeros_like(qn)
    for t in range(length):
        state = np.zeros((batch, heads, dim, dim))
        for s in range(sinks, t - ring + 1):
            decay = np.exp(log_decay[:, s])[:, :, None, None]
            key, value = kn[:, s], vn[:, s]
            if compressor.rule.delta_rule:
                state = decay * state
                error = value - np.einsum("bhkv,bhk->bhv", state, key)
                state = state + strength[:, s][:, :, None, None] * np.einsum("bhk,bhv->bhkv", key, error)
            else:
                state = decay * state + strength[:, s][:, :, None, None] * np.einsum("bhk,bhv->bhkv", key, value)
        reads[:, t] = dim ** -0.5 * np.einsum("bhkv,bhk->bhv", state, qn[:, t])
    return np.asarray(compressor.read_out(jnp.asarray(reads, jnp.float32), h))


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPRESSOR_NAMES)
@pytest.mark.parametrize("window,sinks", [(12, 3), (9, 0)])
def test_chunked_compressor_reads_exactly_the_evicted_tokens_of_a_token_by_token_oracle(tiny_base, name, window,
                                                                                          sinks):
    directory, base_config, _ = tiny_base
    model, _ = ahn_model(directory, base_config, compressor=name, window=window, sinks=sinks, random_readout=0.5)
    block = model.blocks[0]
    x = jnp.take(model.embed.get_value(), tokens(2, 41), axis=0)
    h = block.mixer_norm(x)
    positions = jnp.broadcast_to(jnp.arange(41), (2, 41))
    q, k, v, _ = block.mixer._project(h, positions)
    chunked = block.ahn(h, q, k, v, ring=window - sinks, sinks=sinks)
    expected = oracle_memory(block.ahn, h, q, k, v, ring=window - sinks, sinks=sinks)
    assert np.abs(expected[:, :window]).max() == 0.0  # nothing has left the window yet
    assert np.abs(expected[:, window:]).max() > 1e-3
    np.testing.assert_allclose(np.asarray(chunked), expected, rtol=2e-4, atol=2e-5)  # float32 chunked vs float64


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPRESSOR_NAMES)
def test_zero_initialised_student_equals_sliding_window_with_sinks(tiny_base, name):
    directory, base_config, base_params = tiny_base
    window, sinks = 16, 4
    model, _ = ahn_model(directory, base_config, compressor=name, window=window, sinks=sinks)
    swa_config = dataclasses.replace(base_config, mixers=("swa",) * 3,
                                     swa=SlidingWindowConfig(window=window - sinks, num_sinks=sinks))
    swa = nnx.merge(nnx.split(build_model(swa_config))[0], base_params)
    row = tokens(2, 70)
    student, _ = model(row)
    reference, _ = swa(row)
    np.testing.assert_array_equal(np.asarray(student), np.asarray(reference))
    teacher = model.logits(model.hidden(row))
    assert np.abs(np.asarray(teacher - student))[:, window:].max() > 1e-3  # the window does cut something


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPRESSOR_NAMES)
def test_streaming_decode_equals_the_full_student_forward_at_four_windows(tiny_base, name):
    directory, base_config, _ = tiny_base
    window, sinks = 12, 3
    model, _ = ahn_model(directory, base_config, compressor=name, window=window, sinks=sinks, random_readout=0.5)
    row = tokens(2, 4 * window)
    full, _ = model(row)
    produced, streamed = generate(model, row[:, :5], 4 * window - 5)
    # feed the same tokens: generation picks its own, so stream the row itself through the cache
    cache = model.init_cache(2, 4 * window)
    stream_logits, _ = model(row, cache=cache)
    np.testing.assert_allclose(np.asarray(stream_logits), np.asarray(full), rtol=2e-4, atol=2e-4)
    assert produced.shape == (2, 4 * window) and streamed.shape == (2, 4 * window - 1, base_config.vocab_size)
    # generate's own logits (prefill, then one per step) are the full student's logits of what it produced
    regenerated, _ = model(produced)
    np.testing.assert_allclose(np.asarray(streamed), np.asarray(regenerated[:, :-1]), rtol=2e-4, atol=2e-4)


def cache_bytes(cache) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(cache))


@pytest.mark.slow
def test_cache_bytes_do_not_grow_with_the_decoded_length(tiny_base):
    directory, base_config, _ = tiny_base
    window = 8
    model, _ = ahn_model(directory, base_config, window=window, sinks=2, random_readout=0.5)
    sizes = []
    for length in (2 * window, 8 * window):
        _, cache = model(tokens(1, length), cache=model.init_cache(1, length))
        assert int(cache["position"]) == length
        sizes.append(cache_bytes(cache))
    assert sizes[0] == sizes[1] == cache_bytes(model.init_cache(1, 10 ** 6))


def test_sinks_not_below_the_window_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"^model\.ahn\.sinks: 8 must be below model\.ahn\.window=8"):
        AHNConfig(window=8, sinks=8)


def test_a_base_with_recurrent_layers_is_refused_naming_model_ahn_base():
    with pytest.raises(ConfigError, match=r"^model\.ahn\.base: layers of mixer 'gated_deltanet'"):
        ModelConfig(kind="ahn", mixers=("attention", "gated_deltanet"))


def test_scanned_ahn_layers_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^model\.scan_layers: must be false for model\.kind = ahn"):
        ModelConfig(kind="ahn", scan_layers=True)


def distillation_loss_and_grads(model, params, batch):
    """``(mean KL, its gradients, bytes of temporaries of the compiled program)``."""
    graphdef = nnx.graphdef(model)

    def mean_kl(p):
        total, count = nnx.merge(graphdef, p).loss(batch)
        return total / count

    compiled = jax.jit(jax.value_and_grad(mean_kl)).lower(params).compile()
    return *jax.device_get(compiled(params)), compiled.memory_analysis().temp_size_in_bytes


@pytest.fixture(scope="module")
def small_base(tmp_path_factory):
    """Two layers of d_model 32: enough for remat to change the program, small enough to compile fast."""
    return write_tiny_base(tmp_path_factory.mktemp("ahn_remat") / "base", mixers=("attention",) * 2, d_model=32,
                           num_heads=2, d_ff=48)


@pytest.mark.slow  # 20 s in the fast tier (two compiles of the student's backward, with and without remat)
@pytest.mark.parametrize("random_window", [False, True])
def test_rematerialised_student_layers_give_the_same_loss_and_gradients(small_base, random_window):
    """``model.remat=full`` recomputes each student layer in the backward: the same distillation loss and
    compressor gradients as keeping every residual, with a fixed window and with a traced (window, sinks) draw;
    and the rematerialised program keeps fewer bytes of temporaries."""
    directory, base_config, _ = small_base
    model, params = ahn_model(directory, base_config, window=12, sinks=3, random_readout=0.5,
                              random_window=random_window)
    remat_model, remat_params = ahn_model(directory, dataclasses.replace(base_config, remat="full"), window=12,
                                          sinks=3, random_readout=0.5, random_window=random_window)
    inputs = tokens(2, 65, seed=4)
    batch = {"inputs": inputs[:, :-1], "targets": inputs[:, 1:], "loss_mask": jnp.ones((2, 64), jnp.float32),
             "step": jnp.asarray(3, jnp.int32)}
    loss, grads, temporaries = distillation_loss_and_grads(model, params, batch)
    remat_loss, remat_grads, remat_temporaries = distillation_loss_and_grads(remat_model, remat_params, batch)
    assert loss > 0
    assert remat_temporaries < temporaries, (remat_temporaries, temporaries)
    # the same float32 operations, recomputed: equal up to XLA's fusion choices in the two programs
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
    compressor = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(grads) if "ahn" in str(path)]
    assert compressor and all(np.any(leaf != 0) for leaf in compressor)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.max(np.abs(b))),
                 remat_grads, grads)


@pytest.mark.parametrize("window,sinks,length", [(12, 3, 45), (9, 0, 7), (12, 3, 14)])
def test_slot_positions_are_what_decoding_token_by_token_leaves(window, sinks, length):
    from seqmodels.models.ahn import slot_positions
    ring, held = window - sinks, np.full(window, -1)
    for position in range(length):
        held[position if position < sinks else sinks + (position - sinks) % ring] = position
    np.testing.assert_array_equal(slot_positions(length, window, sinks), held)


@pytest.mark.slow  # 25 s each in the fast tier (the prefill and the token scan both compile)
@pytest.mark.parametrize("name", COMPRESSOR_NAMES)
def test_parallel_prefill_leaves_the_cache_of_the_token_by_token_stream(tiny_base, name):
    """A prompt into a fresh cache runs as one pass: its logits and cache equal stepping the prompt token by
    token (45 tokens: past three windows, not a multiple of the chunk), and decoding on from it agrees."""
    directory, base_config, _ = tiny_base
    window, sinks = 12, 3
    model, _ = ahn_model(directory, base_config, compressor=name, window=window, sinks=sinks, random_readout=0.5)
    row = tokens(2, 48, seed=5)
    prefill_logits, prefilled = model(row[:, :45], cache=model.init_cache(2, 48))
    stream_logits, streamed = model._stream(row[:, :45], model.init_cache(2, 48))
    # float32: the chunked recurrence against the per-token step, the masked attention against the ring's
    np.testing.assert_allclose(np.asarray(prefill_logits), np.asarray(stream_logits), rtol=2e-4, atol=2e-4)
    assert int(prefilled["position"]) == int(streamed["position"]) == 45
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4),
                 prefilled["layers"], streamed["layers"])
    # three more tokens through each cache (the multi-token call on a used cache steps through it)
    after_prefill, _ = model(row[:, 45:], cache=prefilled)
    after_stream, _ = model(row[:, 45:], cache=streamed)
    np.testing.assert_allclose(np.asarray(after_prefill), np.asarray(after_stream), rtol=2e-4, atol=2e-4)
    full, _ = model(row)
    np.testing.assert_allclose(np.asarray(after_prefill), np.asarray(full[:, 45:]), rtol=2e-4, atol=2e-4)


def test_with_mode_copies_the_model_with_zero_read_outs_or_a_window_of_the_whole_row(tiny_base):
    from seqmodels.models.ahn import with_mode
    directory, base_config, _ = tiny_base
    model, _ = ahn_model(directory, base_config, compressor="gated_deltanet", window=12, sinks=3, random_readout=0.5)
    swa, teacher = with_mode(model, "swa", 40), with_mode(model, "teacher", 40)
    assert all(not np.any(np.asarray(block.ahn.readout.get_value())) for block in swa.blocks)
    assert all(np.any(np.asarray(block.ahn.readout.get_value())) for block in model.blocks)  # the model is kept
    assert (swa.config.ahn.window, swa.config.ahn.sinks) == (12, 3) == (model.config.ahn.window, model.config.ahn.sinks)
    assert (teacher.config.ahn.window, teacher.config.ahn.sinks) == (40, 0)
    assert with_mode(model, "ahn", 40) is model
    with pytest.raises(ValueError, match="choose from ahn, swa, teacher"):
        with_mode(model, "full", 40)
    with pytest.raises(ValueError, match="length must be >= 2"):
        with_mode(model, "teacher", 1)


@pytest.mark.slow  # 25 s: three forwards, the prefill and the token scan compile
def test_with_mode_gives_the_sliding_window_and_the_teacher_from_the_same_weights(tiny_base):
    """``swa``: the compressors add nothing (the student at compress=False); ``teacher``: full attention, in the
    forward and through the decoding cache (prefill, then steps)."""
    from seqmodels.models.ahn import with_mode
    directory, base_config, _ = tiny_base
    window, sinks = 12, 3
    model, _ = ahn_model(directory, base_config, compressor="gated_deltanet", window=window, sinks=sinks,
                         random_readout=0.5)
    row = tokens(2, 40, seed=3)
    student, _ = model(row)
    swa_logits = model.logits(model.hidden(row, window=window, sinks=sinks, compress=False))
    teacher_logits = model.logits(model.hidden(row))
    np.testing.assert_allclose(np.asarray(with_mode(model, "swa", 40)(row)[0]), np.asarray(swa_logits),
                               rtol=1e-5, atol=1e-5)
    teacher = with_mode(model, "teacher", 40)
    np.testing.assert_allclose(np.asarray(teacher(row)[0]), np.asarray(teacher_logits), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(swa_logits - student)).max() > 1e-2  # the read-outs were random: the modes differ
    prefilled, cache = teacher(row[:, :30], cache=teacher.init_cache(2, 40))
    stepped, _ = teacher(row[:, 30:], cache=cache)
    np.testing.assert_allclose(np.asarray(jnp.concatenate([prefilled, stepped], axis=1)),
                               np.asarray(teacher_logits), rtol=2e-4, atol=2e-4)
