"""The looped model under ``mesh.context``: the padded layout split over 4 shards (and 2 x 4) gives the read-out,
the loss and the gradients of one device, for bidirectional attention (gathered or by a closed ring) and a
looped recurrence."""

import jax
import numpy as np
import pytest
from flax import nnx

from seqmodels.config import MeshConfig, ModelConfig
from seqmodels.config_looped import LoopedConfig
from seqmodels.data.cfl import sample
from seqmodels.data.cfl.rows import VOCAB_SIZE, labelled_batch
from seqmodels.mixers.attention import AttentionConfig
from seqmodels.mixers.deltanet import DeltaNetConfig
from seqmodels.models.looped import padded_length
from seqmodels.sharding import batch_sharding, make_mesh
from seqmodels.training.state import init_params

# Rows of 10 + 2 tokens (3 per shard at mesh.context = 4); with padding_scale 1 the longest string (N = 10) lays out
# on 12 + 10 = 22 positions, rounded to 24 under 4 shards: its [CLS] (position 21) sits in the last shard and
# its symbols in the first two. No prelude and no coda: the looped block alone (a coda or prelude block runs the
# mixer's split form as an LM's blocks do, checked in tests/seqmodels/layers/test_context.py).
LENGTHS = (4, 10, 6, 8)


def context_mesh(context, data=1):
    return make_mesh(MeshConfig(data=data, fsdp=1, tensor=1, context=context), devices=jax.devices()[:data * context])


def cfl_batch(rows):
    examples = [sample("dyck1", 1, n, i)[0] for i, n in enumerate(LENGTHS[:rows])]
    return labelled_batch("dyck1", examples, seq_len=max(LENGTHS) + 2)


def looped_config(mixer="attention", **changes):
    return ModelConfig(vocab_size=VOCAB_SIZE, d_model=32, num_heads=2, kind="looped", kernel_impl="xla",
                       deltanet=DeltaNetConfig(chunk_size=16),
                       looped=LoopedConfig(mixer=mixer, padding_scale=1.0, loops_scale=0.5, prelude_layers=0,
                                           coda_layers=0, attention="bidirectional"), **changes)


def logits_loss_and_grads(config, mesh, rows):
    with jax.set_mesh(mesh):
        graphdef, params, _ = init_params(config, 0, mesh)
        batch = jax.device_put({k: np.asarray(v) for k, v in cfl_batch(rows).items()}, batch_sharding(mesh))

        @jax.jit
        def run(params, batch):
            def mean_loss(p):
                total, count = nnx.merge(graphdef, p).loss(batch)
                return total / count
            loss, grads = jax.value_and_grad(mean_loss)(params)
            logits = nnx.merge(graphdef, params)(batch["inputs"], segment_ids=batch["segment_ids"])
            return logits, loss, grads

        return jax.device_get(run(params, batch))


def assert_split_equals_one_device(config, *, data):
    rows = 2 * data
    logits, loss, grads = logits_loss_and_grads(config, context_mesh(4, data=data), rows)
    expected = logits_loss_and_grads(config, context_mesh(1), rows)
    # float32; the split layout reorders sums (masked dense attention over gathered keys, the state chain): 1e-5 on
    # logits of size ~1 and on the loss, 1e-4 relative / 1e-6 absolute on gradients, as the other equality tests.
    np.testing.assert_allclose(logits, expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss, expected[1], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, expected[2])


def test_the_padded_layout_rounds_up_to_whole_shards():
    looped = looped_config().looped
    assert padded_length(looped, 12) == 22 and padded_length(looped, 12, 4) == 24 and padded_length(looped, 12, 2) == 22


@pytest.mark.slow  # 13-20 s on 2 busy cores
def test_bidirectional_looped_attention_split_over_context_equals_one_device():
    assert_split_equals_one_device(looped_config(), data=1)


@pytest.mark.slow  # ~25 s
def test_bidirectional_looped_attention_by_a_closed_ring_over_data_and_context_equals_one_device():
    assert_split_equals_one_device(looped_config(attention=AttentionConfig(context_impl="ring")), data=2)


@pytest.mark.slow  # ~40 s
def test_a_looped_gated_deltanet_split_over_context_equals_one_device():
    assert_split_equals_one_device(looped_config("gated_deltanet", remat="full"), data=2)
