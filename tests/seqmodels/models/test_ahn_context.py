"""AHN under ``mesh.context``: the student's outputs, the distillation loss and its gradients with the row split
over 4 shards (2 x 4 for every compressor, 1 x 4 for a random window) equal one device's; a short training run's
losses too."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from seqmodels.config import MeshConfig
from seqmodels.models.ahn_compressor import COMPRESSORS
from seqmodels.sharding import batch_sharding, make_mesh
from tests.seqmodels.models.ahn_fixtures import ahn_model, tokens, write_tiny_base

LENGTH = 64  # 16 tokens per shard at mesh.context = 4
# window 12 with 3 sinks: the ring of 9 recent tokens and the evicted token t - 9 cross shard boundaries, and the
# row's 3 sinks (in shard 0) are seen from every later shard.
WINDOW, SINKS = 12, 3


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """One layer, d_model 32, 2 query heads over 2 key/value heads of 16: small, so each compile is short."""
    return write_tiny_base(tmp_path_factory.mktemp("ahn_context") / "base", mixers=("attention",), d_model=32,
                           num_heads=2, d_ff=48)


def context_mesh(context, data=1):
    return make_mesh(MeshConfig(data=data, fsdp=1, tensor=1, context=context), devices=jax.devices()[:data * context])


def packed_batch(rows):
    """Rows of ``LENGTH`` tokens with document boundaries inside and across shards (AHN reads a row as one
    stream; the segment ids travel with it) and a loss mask that drops a few positions."""
    lengths = [[10, 25, 29], [40, 24], [3, 13, 16, 32], [64]][:rows]
    segments = np.concatenate([np.repeat(np.arange(1, len(row) + 1), row)[None] for row in lengths])
    inputs = tokens(rows, LENGTH + 1, seed=3)
    mask = np.ones((rows, LENGTH), np.float32)
    mask[:, 30:34] = 0.0
    return {"inputs": inputs[:, :-1], "targets": inputs[:, 1:], "segment_ids": jnp.asarray(segments, jnp.int32),
            "loss_mask": jnp.asarray(mask), "step": jnp.asarray(5, jnp.int32)}


def student_loss_and_grads(model, params, mesh, rows):
    """``(student logits, summed KL, count, d(mean KL)/d params)`` on ``mesh``, the batch split over it."""
    graphdef = nnx.graphdef(model)
    with jax.set_mesh(mesh):
        params = jax.device_put(params, NamedSharding(mesh, P()))
        batch = packed_batch(rows)
        step = batch.pop("step")
        batch = {**jax.device_put(batch, batch_sharding(mesh)), "step": step}

        @jax.jit
        def run(params, batch):
            def mean_kl(p):
                total, count = nnx.merge(graphdef, p).loss(batch)
                return total / count, (total, count)
            (_, (total, count)), grads = jax.value_and_grad(mean_kl, has_aux=True)(params)
            logits, _ = nnx.merge(graphdef, params)(batch["inputs"])
            return logits, total, count, grads

        return jax.device_get(run(params, batch))


def assert_split_equals_one_device(model, params, *, data):
    rows = 2 * data
    logits, total, count, grads = student_loss_and_grads(model, params, context_mesh(4, data=data), rows)
    expected = student_loss_and_grads(model, params, context_mesh(1), rows)
    # float32: the split rows reorder sums (masked dense attention against the fused kernel, the state chain and
    # its correction; a random read-out of scale 0.5 makes the compressor's share visible). On a 2-layer base the
    # split differed by up to 6e-5 on logits of size ~4 and 2.3e-4 of a gradient leaf's largest entry, where one
    # device with 64-token chunks instead of 16 differs by 1.5e-5 and 6e-5: 1e-4 absolute on the logits,
    # 5e-4 of each gradient leaf's largest entry (and 1e-4 relative) on the gradients.
    np.testing.assert_allclose(logits, expected[0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(total, expected[1], rtol=1e-5)
    assert count == expected[2]
    compressor_grads = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(grads) if "ahn" in str(path)]
    assert all(np.any(leaf != 0) for leaf in compressor_grads)  # the compressors' outputs reach the loss
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-4 * np.max(np.abs(b))),
                 grads, expected[3])


def test_the_kl_in_chunks_within_each_shard_equals_the_row_kl():
    """The loss's chunks lie within the shards (ragged: 16 positions per shard in chunks of 6), same sum."""
    from seqmodels.models.ahn_loss import chunked_kl
    keys = jax.random.split(jax.random.key(0), 4)
    student, teacher = (jax.random.normal(key, (2, LENGTH, 8)) for key in keys[:2])
    head = jax.random.normal(keys[2], (8, 11))
    weights = (jax.random.uniform(keys[3], (2, LENGTH)) > 0.3).astype(jnp.float32)
    whole = chunked_kl(student, teacher, head, weights, chunk=LENGTH)
    # float32 sums of 128 terms in another order: 1e-5 relative
    np.testing.assert_allclose(chunked_kl(student, teacher, head, weights, chunk=6, shards=4), whole, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot be split into 3 equal pieces"):
        chunked_kl(student, teacher, head, weights, chunk=6, shards=3)


# Measured on 2 busy cores: 11-20 s each for the delta rules (their split form compiles two kernel passes), 7-13 s
# for mamba2, all slow; the fast tier keeps the KL-in-shards test here and the halo and the state scan at the op
# level (tests/seqmodels/layers/test_context.py, test_state_passing.py). Each row runs on its own 4 shards as with
# mesh.data = 1 (the random-window test below), the batch split over mesh.data = 2 besides.
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_ahn_split_over_data_and_context_equals_one_device(tiny_base, name):
    directory, base_config, _ = tiny_base
    model, params = ahn_model(directory, base_config, compressor=name, window=WINDOW, sinks=SINKS,
                              random_readout=0.5)
    assert_split_equals_one_device(model, params, data=2)


@pytest.mark.slow
def test_ahn_random_window_split_over_context_gathers_and_equals_one_device(tiny_base):
    """A traced (window, sinks) draw (window 16 or 32 at rows of 64: the ring reaches past a shard) takes the
    gathered row for the window and the evicted stream."""
    directory, base_config, _ = tiny_base
    model, params = ahn_model(directory, base_config, window=WINDOW, sinks=SINKS, random_readout=0.5,
                              random_window=True)
    assert_split_equals_one_device(model, params, data=1)


def losses(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


@pytest.mark.slow  # three short distillation runs of a one-layer base
def test_an_ahn_distillation_run_split_over_context_matches_the_unsplit_losses_and_resumes_on_another_split(
        tmp_path, tiny_corpus):
    from seqmodels.config_io import load_config
    from seqmodels.hf.base import resolve_base
    from seqmodels.training.loop import train
    directory, _, _ = write_tiny_base(tmp_path / "base", vocab_size=320, max_seq_len=256, mixers=("attention",),
                                      d_model=32, num_heads=2, d_ff=48)

    def run(name, data, context, *extra):
        overrides = ["model.kind=ahn", f"model.ahn.base={directory}", f"model.ahn.window={WINDOW}",
                     f"model.ahn.sinks={SINKS}", "model.ahn.chunk_size=16", "model.ahn.compressor=gated_deltanet",
                     "model.kernel_impl=xla", "data.source=text_files", f"data.path={tiny_corpus}",
                     f"data.seq_len={LENGTH}", "data.heldout_fraction=0.2", "train.batch_size=8", "train.steps=4",
                     f"train.run_dir={tmp_path / name}", "optim.warmup_steps=1", "log.every_steps=1", "log.progress=never",
                     "log.tensorboard=false", "checkpoint.async_save=false", "checkpoint.every_steps=2",
                     f"mesh.data={data}", f"mesh.context={context}", *extra]
        train(resolve_base(load_config(None, overrides)))
        return losses(tmp_path / name)

    whole = run("whole", 8, 1)
    run("split", 2, 4, "train.exit_at_step=2")
    split = run("split", 4, 2)  # resumes at step 3 from the checkpoint written at context 4, now at context 2
    assert sorted(whole) == sorted(split) == [1, 2, 3, 4]
    assert whole[4] != whole[1]  # the compressors train: the loss moves
    # float32; the split rows sum the attention, the state chain and the loss in another order: 2e-5
    np.testing.assert_allclose([split[s] for s in range(1, 5)], [whole[s] for s in range(1, 5)], rtol=0, atol=2e-5)
