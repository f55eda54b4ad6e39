"""Per-layer diagnostics of the Atlas mixer: computed from the forward's own intermediates, named by layer,
the same with scanned layers, and written to metrics.jsonl and TensorBoard by a training run."""

import dataclasses
import json
import math
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_overrides
from pallas_kernels.atlas_memory import atlas_memory
from seqmodels.config import ModelConfig
from seqmodels.config_io import load_config
from seqmodels.mixers.atlas import AtlasConfig
from seqmodels.models import build_model
from seqmodels.training.diagnostics import flatten, loss_and_diagnostics
from seqmodels.training.loop import train

QUANTITIES = ("memory_norm", "readout_ratio", "alpha", "theta", "eta", "gamma")


def tiny_config(mixers=("atlas", "attention", "atlas_mag")):
    atlas = AtlasConfig(window=3, chunk_size=4, poly_key_dim=4, ns_steps=1, memory_norm=True)
    return ModelConfig(d_model=32, num_heads=2, mixers=mixers, max_seq_len=16, kernel_impl="xla", atlas=atlas)


def batch(config, seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (2, 12), 0, config.vocab_size)
    segments = jnp.asarray([[1] * 7 + [2] * 5, [1] * 10 + [0] * 2], jnp.int32)
    return {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1), "loss_mask": segments != 0,
            "segment_ids": segments}


@pytest.mark.slow
def test_diagnostics_are_the_layers_own_memory_readout_and_gates():
    config = tiny_config()
    model, data = build_model(config, seed=3), batch(config)
    (loss_sum, _), diagnostics = loss_and_diagnostics(model, data)
    # Layer 0 (atlas) and layer 2 (the memory of atlas_mag) report; the attention layer does not.
    assert sorted(diagnostics) == sorted(f"atlas/layer_{i}/{q}" for i in (0, 2) for q in QUANTITIES)
    assert float(loss_sum) == pytest.approx(float(model.loss(data)[0]), rel=1e-6)  # the same forward
    # Recompute layer 0's quantities from its inputs, written out, with the token-by-token oracle of the
    # memory (a scan of the decoding step, gradients by autodiff) in place of the chunked forward the model runs.
    block = model.blocks[0]
    x = block.mixer_norm(jnp.take(model.embed.get_value(), data["inputs"], axis=0))
    inputs, _, _ = block.mixer._inputs(x, data["segment_ids"], None)
    initial = tuple(w.get_value() for w in block.mixer.initial_memory)
    y, memory = atlas_memory(inputs, initial, block.mixer.settings, impl="reference", return_memory=True)
    valid = np.asarray(data["segment_ids"] != 0, np.float64)[..., None]  # [B, T, 1]
    norms = np.sqrt(sum(np.sum(np.square(np.asarray(w, np.float64)), axis=(-2, -1)) for w in memory))
    expected = {"memory_norm": norms.mean(),
                "readout_ratio": (np.linalg.norm(y, axis=-1) * valid).sum() / (np.linalg.norm(inputs.values, axis=-1)
                                                                              * valid).sum(),
                **{g: (np.asarray(getattr(inputs, g)) * valid).sum() / (valid.sum() * 2) for g in
                   ("alpha", "theta", "eta", "gamma")}}
    for quantity, value in expected.items():
        assert float(diagnostics[f"atlas/layer_0/{quantity}"]) == pytest.approx(value, rel=1e-4), quantity
    low, high = config.atlas.eta_range
    assert low < float(diagnostics["atlas/layer_2/eta"]) < high
    # Outside nnx.capture nothing is sown: the model holds no intermediates after a plain call.
    model.loss(data)
    assert not nnx.state(model, nnx.Intermediate)


@pytest.mark.slow
def test_scanned_layers_report_the_same_diagnostics_under_the_unrolled_names():
    config = tiny_config(mixers=("atlas", "attention") * 2)
    data = batch(config, seed=1)
    _, unrolled = loss_and_diagnostics(build_model(config, seed=0), data)
    _, scanned = loss_and_diagnostics(build_model(dataclasses.replace(config, scan_layers=True), seed=0), data)
    assert sorted(scanned) == sorted(unrolled) == sorted(f"atlas/layer_{i}/{q}" for i in (0, 2) for q in QUANTITIES)
    for name, value in unrolled.items():
        assert float(scanned[name]) == pytest.approx(float(value), rel=1e-4), name
    assert float(unrolled["atlas/layer_0/memory_norm"]) != float(unrolled["atlas/layer_2/memory_norm"])


def test_a_sown_value_outside_a_block_is_an_error_naming_its_path():
    with pytest.raises(ValueError, match="diagnostics sown outside a block of model.mixers"):
        flatten(nnx.State({"head": {"atlas_diagnostics": nnx.Intermediate(({"memory_norm": jnp.ones(())},))}}))


def _scalar_tags(path):
    """Tags of the scalar summaries in a TensorBoard event file (TFRecord framing: length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2
    data, offset, tags = path.read_bytes(), 0, set()
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        event = event_pb2.Event()
        event.ParseFromString(data[offset + 12: offset + 12 + length])
        tags.update(value.tag for value in event.summary.value)
        offset += 12 + length + 4
    return tags


@pytest.mark.slow
def test_a_tiny_run_logs_finite_atlas_diagnostics_per_layer_to_metrics_and_tensorboard(tmp_path, tiny_corpus):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, tiny_corpus, train__steps=3, model__mixers="[atlas, attention]",
                               model__atlas__chunk_size=8, model__atlas__poly_key_dim=4, model__atlas__ns_steps=1,
                               model__atlas__window=2, model__kernel_impl="xla", train__grad_accum=2,
                               train__batch_size=16)
    train(load_config(None, overrides))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        for quantity in QUANTITIES:
            assert math.isfinite(record[f"atlas/layer_0/{quantity}"]), quantity
        assert not any(key.startswith("atlas/layer_1/") for key in record)  # layer 1 is attention
        assert record["atlas/layer_0/memory_norm"] > 0 and 0.9 <= record["atlas/layer_0/alpha"] <= 1.0
    tags = set().union(*(_scalar_tags(path) for path in (run_dir / "tb").glob("events.out.tfevents.*")))
    assert {f"train/atlas/layer_0/{q}" for q in QUANTITIES} <= tags
