"""Ring attention under ``mesh.context`` (``seqmodels.layers.ring_attention``): its outputs and its own backward
equal one device's attention in both layouts, its saved residuals do not grow with the number of shards, the
load-balanced plan gives every shard equal work and misses no causal pair, and a bad layout is refused by name."""

import contextlib
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from seqmodels.config import ConfigError, MeshConfig
from seqmodels.layers.attention import attend_rows
from seqmodels.layers.context import context_map, from_balanced, to_balanced
from seqmodels.layers.context_attention import split_attention
from seqmodels.layers import ring_attention
from seqmodels.layers.ring_attention import round_plan
from seqmodels.mixers.attention import AttentionConfig
from seqmodels.models.lm import document_positions
from seqmodels.sharding import make_mesh

LENGTH = 64  # 16 tokens per shard at mesh.context = 4: half-shards of 8
# Documents that start inside a shard, span two to four shards, and a padded tail (segment 0: sees no key).
DOCUMENTS = [[10, 25, 29], [40, 24], [3, 13, 16, 22, -10], [64]]


def context_mesh(context, data=1):
    return make_mesh(MeshConfig(data=data, fsdp=1, tensor=1, context=context), devices=jax.devices()[:data * context])


def packed_segments():
    rows = [np.concatenate([np.full(abs(n), i + 1 if n > 0 else 0) for i, n in enumerate(row)]) for row in DOCUMENTS]
    return jnp.asarray(np.stack(rows), jnp.int32)


def attention_inputs(seed, length=LENGTH, rows=4):
    """q ``[B, T, 4, 8]``, k/v ``[B, T, 2, 8]`` (grouped-query heads), packed segment ids and their positions."""
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (rows, length, 4, 8))
    k, v = (jax.random.normal(key, (rows, length, 2, 8)) for key in keys[1:])
    segments = packed_segments()[:rows, :length]
    return q, k, v, segments, document_positions(segments)


def output_and_grads(attention, cotangent):
    def run(q, k, v, segments, positions):
        out, pullback = jax.vjp(lambda *qkv: attention(*qkv, segments, positions), q, k, v)
        return out, pullback(cotangent)
    return run


def ring(causal, layout):
    return lambda *args: split_attention(*args, window=None, num_sinks=0, causal=causal, implementation="xla",
                                         context_impl="ring", context_layout=layout)


@pytest.mark.parametrize("data", [1, 2])
@pytest.mark.parametrize("causal, layout", [(True, "balanced"), (True, "contiguous"), (False, "balanced")])
def test_ring_outputs_and_gradients_equal_one_device_on_packed_rows(causal, layout, data):
    check_ring_against_one_device(causal, layout, data)


@pytest.mark.parametrize("causal, layout", [(True, "balanced"), (False, "balanced")])
def test_ring_in_query_tiles_equals_one_device(monkeypatch, causal, layout):
    """Sub-blocks folded (forward) and differentiated (backward) in tiles of 4 query rows, as long shards are."""
    monkeypatch.setattr(ring_attention, "QUERY_TILE", 4)
    assert ring_attention.query_tile(8) == 4 and ring_attention.query_tile(16) == 4
    check_ring_against_one_device(causal, layout, 1)


def check_ring_against_one_device(causal, layout, data):
    q, k, v, segments, positions = attention_inputs(0)
    padding = (segments == 0)[:, :, None, None]
    # Padding queries see no key: the ring gives them zeros, the one-device XLA path averages every value; no
    # cotangent reaches them (as no loss does), so the gradients compare.
    cotangent = jnp.where(padding, 0.0, jax.random.normal(jax.random.key(1), q.shape))
    one_device = lambda *args: attend_rows(*args, window=None, num_sinks=0, causal=causal, implementation="xla")
    expected_out, expected_grads = output_and_grads(one_device, cotangent)(q, k, v, segments, positions)
    mesh = context_mesh(4, data=data)
    with jax.set_mesh(mesh):
        placed = jax.device_put((q, k, v, segments, positions, cotangent), NamedSharding(mesh, P("data", "context")))
        out, grads = jax.jit(lambda *args: output_and_grads(ring(causal, layout), args[-1])(*args[:-1]))(*placed)
    assert np.all(np.asarray(out)[np.broadcast_to(padding, q.shape)] == 0.0)
    # float32 softmax over at most 64 keys, the same sums in another grouping: 1e-5
    np.testing.assert_allclose(np.where(padding, 0.0, out), np.where(padding, 0.0, expected_out), rtol=1e-5,
                               atol=1e-5)
    for got, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def saved_bytes_per_shard(fn, args, shards):
    """Bytes of the residuals autodiff keeps for ``fn``'s backward, per shard: shard_map stacks each shard's
    residuals along a leading axis and the arguments are global, so the total divided by ``shards``."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(fn, *args)
    total = 0
    for line in printed.getvalue().splitlines():
        kind, bits, dims = re.match(r"([a-z]+)(\d*)\[([\d,]*)\]", line).groups()
        size = int(np.prod([int(d) for d in dims.split(",") if d]))
        total += size * (int(bits) if bits else 8) // 8
    return total / shards


@pytest.mark.parametrize("layout", ["balanced", "contiguous"])
def test_the_rings_saved_residuals_do_not_grow_with_the_number_of_shards(layout):
    """16 tokens per shard at C = 2 and C = 4: the ring's backward keeps this shard's q, k, v, segment ids,
    positions, output and lse, not the C blocks it received (autodiff of the rounds keeps those)."""
    saved = {}
    for shards in (2, 4):
        q, k, v, segments, positions = attention_inputs(2, length=16 * shards, rows=2)
        mesh = context_mesh(shards)
        with jax.set_mesh(mesh):
            placed = jax.device_put((q, k, v, segments, positions), NamedSharding(mesh, P(None, "context")))
            attention = lambda q, k, v: ring(True, layout)(q, k, v, *placed[3:])
            saved[shards] = saved_bytes_per_shard(attention, placed[:3], shards)
    per_shard_inputs = 2 * 16 * (4 + 2 + 2) * 8 * 4  # q, k, v float32
    assert saved[4] == saved[2], saved
    assert saved[2] <= 3 * per_shard_inputs, saved  # q, k, v, the output (q's size), lse and the int rows


def chunks_of(shard, shards, layout):
    """The row's chunks (of 2C) that ``shard``'s first and second halves hold."""
    if layout == "contiguous":
        return {"first": 2 * shard, "second": 2 * shard + 1}
    return {"first": shard, "second": 2 * shards - 1 - shard}


def folded_pairs(shard, shards, layout, causal=True):
    """``(query chunk, key chunk)`` half-by-half sub-blocks ``shard`` folds over the whole ring, as its plan says."""
    pairs = []
    for round_ in range(shards):
        branches, pick = round_plan(round_, causal=causal, layout=layout)
        queries = chunks_of(shard, shards, layout)
        keys = chunks_of((shard - round_) % shards, shards, layout)
        for q_part, k_part in branches[int(pick(shard))]:
            pairs += [(queries[a], keys[b]) for a in (("first", "second") if q_part == "all" else (q_part,))
                      for b in (("first", "second") if k_part == "all" else (k_part,))]
    return pairs


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_the_balanced_ring_folds_equal_work_on_every_shard_and_every_causal_pair_once(shards):
    """Counted from the plan the ring runs (``round_plan``): balanced, every shard folds 2C + 1 half-by-half
    sub-blocks; contiguous, shard c folds 4 (c + 1). Either way each shard folds each (query chunk, key chunk)
    pair with the key chunk not after the query chunk exactly once; the balanced plan folds no other, the
    contiguous one also the masked upper half of its diagonal block (chunk 2c's queries, chunk 2c + 1's keys)."""
    for layout in ("balanced", "contiguous"):
        work = []
        for shard in range(shards):
            pairs = folded_pairs(shard, shards, layout)
            held = chunks_of(shard, shards, layout).values()
            causal_pairs = [(a, b) for a in held for b in range(2 * shards) if b <= a]
            assert sorted(pair for pair in pairs if pair in causal_pairs) == sorted(causal_pairs), (layout, shard)
            above = [pair for pair in pairs if pair not in causal_pairs]
            assert above == ([] if layout == "balanced" else [(2 * shard, 2 * shard + 1)]), (layout, shard, above)
            work.append(len(pairs))
        expected = [2 * shards + 1] * shards if layout == "balanced" else [4 * (c + 1) for c in range(shards)]
        assert work == expected, (layout, work)
    bidirectional = [len(folded_pairs(shard, shards, "contiguous", causal=False)) for shard in range(shards)]
    assert bidirectional == [4 * shards] * shards


@pytest.mark.parametrize("shards", [3, 4])
def test_the_balanced_layout_holds_chunks_c_and_2c_minus_1_minus_c_and_goes_back(shards):
    x = jnp.arange(2 * 8 * shards, dtype=jnp.float32).reshape(2, 8 * shards)  # chunks of 4 tokens
    mesh = context_mesh(shards)
    names = ("batch", "seq")
    with jax.set_mesh(mesh):
        moved = jax.jit(lambda x: context_map(lambda x: to_balanced(x, shards), (x,), (names,), names))(x)
        back = jax.jit(lambda x: context_map(lambda x: from_balanced(x, shards), (x,), (names,), names))(moved)
    chunks = np.asarray(x).reshape(2, 2 * shards, 4)
    order = [chunk for c in range(shards) for chunk in (c, 2 * shards - 1 - c)]
    np.testing.assert_array_equal(np.asarray(moved), chunks[:, order].reshape(2, -1))
    np.testing.assert_array_equal(np.asarray(back), np.asarray(x))


def test_a_bad_context_layout_is_refused_by_name():
    with pytest.raises(ConfigError, match="model.attention.context_layout: must be balanced or contiguous, got 'zig'"):
        AttentionConfig(context_layout="zig")
    q, k, v, segments, positions = attention_inputs(3)
    with pytest.raises(ValueError, match="model.attention.context_layout must be one of"):
        split_attention(q, k, v, segments, positions, window=None, num_sinks=0, causal=True, context_impl="ring",
                        context_layout="zig")
    q, k, v, segments, positions = attention_inputs(3, length=20, rows=1)  # 5 tokens per shard: no halves
    with jax.set_mesh(context_mesh(4)), pytest.raises(ValueError, match="context_layout=contiguous"):
        ring(True, "balanced")(q, k, v, segments, positions)


def test_context_layout_is_listed_by_help_config():
    from seqmodels.config_io import help_text
    assert any(line.startswith("model.attention.context_layout = 'balanced'") and "2C - 1 - c" in line
               for line in help_text().splitlines())
