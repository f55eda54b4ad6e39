"""Context parallelism (``mesh.context``): the halo and the state prefix scan equal their one-device
definitions, and every registered mixer either runs with the sequence split over 4 devices with the
loss and gradients of one device, or is refused with a message naming it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from seqmodels.config import ConfigError, MeshConfig, ModelConfig
from seqmodels.layers.context import context_map, incoming_states, matrix_apply, previous_tail
from seqmodels.layers.conv import ShortConv
from seqmodels.mixers import MIXERS, check_context_parallel
from seqmodels.mixers.atlas import AtlasConfig
from seqmodels.mixers.deltanet import DeltaNetConfig
from seqmodels.mixers.attention import AttentionConfig, SlidingWindowConfig
from seqmodels.mixers.mamba2 import Mamba2Config
from seqmodels.mixers.registry import context_parallel_mixers, context_parallel_notes, register
from seqmodels.sharding import batch_sharding, make_mesh
from seqmodels.training.state import init_params

LENGTH = 64  # 16 tokens per shard at mesh.context = 4


def context_mesh(context, data=1):
    return make_mesh(MeshConfig(data=data, fsdp=1, tensor=1, context=context),
                     devices=jax.devices()[:data * context])


def test_mesh_context_multiplies_with_the_other_axes_and_splits_the_batch_tokens():
    mesh = context_mesh(4, data=2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "context": 4, "tensor": 1}
    assert batch_sharding(mesh).spec == P("data", "context")
    with pytest.raises(ValueError, match="context=4 tensor=1 multiply to 16"):
        make_mesh(MeshConfig(data=4, context=4))
    with pytest.raises(ConfigError, match="mesh.context"):
        MeshConfig(context=0)


def test_mesh_context_is_listed_by_help_config():
    from seqmodels.config_io import help_text
    assert any(line.startswith("mesh.context = 1") and "contiguous shards" in line
               for line in help_text().splitlines())


def test_the_halo_is_the_previous_shards_tail_and_zeros_before_the_row():
    mesh = context_mesh(4)
    x = jnp.arange(2 * LENGTH, dtype=jnp.float32).reshape(2, LENGTH)
    with jax.set_mesh(mesh):
        halo = jax.jit(lambda x: context_map(lambda x: previous_tail(x, 3, 4), (x,), (("batch", "seq"),),
                                             ("batch", "seq")))(x)
    expected = np.zeros((2, 4, 3), np.float32)
    shards = np.asarray(x).reshape(2, 4, 16)
    expected[:, 1:] = shards[:, :-1, -3:]
    np.testing.assert_array_equal(np.asarray(halo).reshape(2, 4, 3), expected)


@pytest.mark.parametrize("shards", [4, 8])
def test_the_state_prefix_scan_equals_the_sequential_chain(shards):
    """Shard c's incoming state is ``A_{c-1} (... (A_0 0 + F_0) ...) + F_{c-1}``, float32."""
    keys = jax.random.split(jax.random.key(shards), 2)
    transitions = 0.5 * jax.random.normal(keys[0], (shards, 2, 3, 4, 4))  # [C, B, H, K, K]
    finals = jax.random.normal(keys[1], (shards, 2, 3, 4, 5))  # [C, B, H, K, V]
    expected, state = [], jnp.zeros((2, 3, 4, 5))
    for c in range(shards):
        expected.append(state)
        state = matrix_apply(transitions[c], state) + finals[c]
    mesh = context_mesh(shards)
    names = ("seq", "batch", "heads", None, None)  # the shard index leads: one [1, B, H, ...] block each

    def local(transition, final):
        return incoming_states(transition[0], final[0], shards, matrix_apply)[None]

    with jax.set_mesh(mesh):
        got = jax.jit(lambda a, f: context_map(local, (a, f), (names, names), names))(transitions, finals)
    # float32 products of up to 8 random 4x4 matrices: 1e-5 relative
    np.testing.assert_allclose(np.asarray(got), np.stack(expected), rtol=1e-5, atol=1e-5)


def packed_rows(rows, seed=0):
    """Rows of ``LENGTH`` tokens packing documents whose boundaries fall inside and across the 16-token shards."""
    lengths = [[10, 25, 29], [40, 24], [3, 13, 16, 32], [64]][:rows]
    segments = np.concatenate([np.repeat(np.arange(1, len(row) + 1), row)[None] for row in lengths])
    tokens = jax.random.randint(jax.random.key(seed), (rows, LENGTH + 1), 0, 40)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": jnp.asarray(segments, jnp.int32),
            "loss_mask": jnp.ones((rows, LENGTH), jnp.float32)}


def test_the_short_convolution_with_a_halo_equals_the_whole_sequence():
    conv = ShortConv(8, 4, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (4, LENGTH, 8))
    segments = packed_rows(4)["segment_ids"]
    expected, _ = conv(x, segment_ids=segments)
    mesh = context_mesh(4)
    with jax.set_mesh(mesh):
        placed = jax.device_put((x, segments), NamedSharding(mesh, P(None, "context")))
        got, _ = nnx.jit(lambda conv, x, s: conv(x, segment_ids=s))(conv, *placed)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)


def model_config(name, **extra):
    return ModelConfig(d_model=32, num_heads=2, vocab_size=40, max_seq_len=LENGTH, mixers=(name, name),
                       kernel_impl="xla", deltanet=DeltaNetConfig(chunk_size=16),
                       mamba2=Mamba2Config(state_dim=16, chunk_size=16),
                       swa=SlidingWindowConfig(window=24, num_sinks=2), **extra)


def loss_and_grads(config, mesh, rows):
    with jax.set_mesh(mesh):
        graphdef, params, _ = init_params(config, 0, mesh)
        data = jax.device_put(packed_rows(rows), batch_sharding(mesh))

        @jax.jit
        def step(params, data):
            def mean_loss(p):
                loss_sum, count = nnx.merge(graphdef, p).loss(data)
                return loss_sum / count
            return jax.value_and_grad(mean_loss)(params)

        return jax.device_get(step(params, data))


def assert_split_equals_one_device(config, *, data):
    rows = 2 * data
    expected_loss, expected_grads = loss_and_grads(config, context_mesh(1), rows)
    loss, grads = loss_and_grads(config, context_mesh(4, data=data), rows)
    # float32; the split sequence reorders sums (the state chain, the correction): 1e-5 relative on the
    # loss, 1e-4 relative / 1e-6 absolute on gradients, as the other sharded-equality tests.
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, expected_grads)


# The Atlas memory (atlas, and the memory branch of atlas_mag and atlas_mal) runs its shards in sequence
# (seqmodels.layers.sequential_passing), one code path whatever its settings: atlas checks it at its defaults
# (a deep memory, Newton-Schulz, one chunk of 16 per shard) on packed rows; the others at cheaper settings that
# compile in a fraction of the time. TITANS: Titans' rule on a linear memory in chunks of 8, two per shard.
TITANS = AtlasConfig(window=1, chunk_size=8, poly_degree=1, ns_steps=0, memory_depth=1, eta_range=(0.0, 0.5))
# WINDOWED: the same linear memory with an Omega window of 3 tokens, whose state (the window's last tokens)
# crosses the chunk and shard boundaries besides the memory and the momentum.
WINDOWED = AtlasConfig(window=3, chunk_size=8, poly_degree=1, ns_steps=0, memory_depth=1, eta_range=(0.0, 0.2))
ATLAS_SETTINGS = {"atlas_mag": TITANS, "atlas_mal": WINDOWED}

# Measured at 11-38 s each (one layer; atlas 86 s) on 2 cores at load 6 (the chunked second-order and scan
# backwards compile slowly); their recurrences are checked in the fast tier at the op level (test_state_passing.py).
# The Atlas mixers: their split op is checked in the fast tier in test_sequential_passing.py.
SLOW_MIXERS = {"deltanet", "mamba2", "longhorn", "muonssm_mamba2", "muonssm_gated_deltanet", "muonssm_longhorn",
               "atlas", "atlas_mag", "atlas_mal"}


def by_cost(names):
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_MIXERS else name for name in names]


def mixer_config(name, atlas_settings=ATLAS_SETTINGS, **extra):
    """``model_config`` of the mixer, its Atlas memory at ``atlas_settings[name]`` where it has an entry."""
    return model_config(name, **({"atlas": atlas_settings[name]} if name in atlas_settings else {}), **extra)


@pytest.mark.parametrize("name", by_cost(context_parallel_mixers()))
def test_context_parallel_mixers_match_one_device_on_packed_rows(name):
    """One layer of the mixer (two, one after the other, in the scanned test below); atlas_mag's memory is Titans'
    (window 1, a linear memory in chunks of 8, two per shard), atlas_mal's WINDOWED."""
    assert_split_equals_one_device(dataclasses.replace(mixer_config(name), mixers=(name,)), data=2)


@pytest.mark.parametrize("layout", ["balanced", "contiguous"])
def test_attention_by_ring_matches_one_device_on_packed_rows(layout):
    attention = AttentionConfig(context_impl="ring", context_layout=layout)
    assert_split_equals_one_device(model_config("attention", attention=attention), data=2)


@pytest.mark.slow
def test_attention_by_ring_matches_one_device_scanned_and_rematerialised():
    assert_split_equals_one_device(model_config("attention", attention=AttentionConfig(context_impl="ring"),
                                                scan_layers=True, remat="full"), data=1)


# Two layers, scanned. atlas_mag and atlas_mal are left out here: their memory is atlas's and their attention
# branch attention's or swa's, each checked here scanned and rematerialised; on packed rows above all three are.
# atlas runs here at WINDOWED (the shards in sequence with the memory, the momentum and the window crossing them).
# deltanet is left out: its split op is gated_deltanet's (split_gated_delta_rule) without the decay, which runs
# unrolled on packed rows above and at the op level in test_state_passing.py (delta_rule_without_decay).
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in context_parallel_mixers()
                                  if n not in ("atlas_mag", "atlas_mal", "deltanet")])
def test_context_parallel_mixers_match_one_device_scanned_and_rematerialised(name):
    assert_split_equals_one_device(mixer_config(name, {"atlas": WINDOWED}, scan_layers=True, remat="full"), data=1)


def test_a_mixer_without_a_context_parallel_form_is_refused_by_name(monkeypatch):
    """Every registered mixer has a split form; one registered without it is refused, named."""
    assert set(context_parallel_mixers()) == set(MIXERS)
    plain = dataclasses.replace(MIXERS["attention"], context_parallel=False, context_note="")
    monkeypatch.setitem(MIXERS, "plain", plain)
    check_context_parallel(("plain",), 1)
    with pytest.raises(ConfigError, match="mesh.context=4: model.mixers has plain, which cannot yet run"):
        check_context_parallel(("gated_deltanet", "plain"), 4)


def test_the_atlas_mixers_state_their_sequential_cost_once_per_note_and_only_when_split():
    assert context_parallel_notes(["atlas", "attention", "atlas_mal", "atlas"], 1) == []
    assert context_parallel_notes(["attention", "gated_deltanet"], 4) == []
    (note,) = context_parallel_notes(["atlas", "attention", "atlas_mal", "atlas"], 4)
    assert note.startswith("atlas, atlas_mal: mesh.context=4 runs the Atlas memory's 4 shards in sequence")
    assert "4x one shard's memory-op time per layer, 4 state ppermutes" in note
    with pytest.raises(ValueError, match="a context_note describes a context-parallel form"):
        register("noted", MIXERS["attention"].build, MIXERS["attention"].flops_per_token, sections=("attention",),
                 context_note="runs in {context} rounds")
    assert "noted" not in MIXERS



def test_model_kinds_without_a_context_parallel_form_are_refused(monkeypatch):
    """Every declared kind (lm, looped, ahn) has a split form; one declared without it is refused, named."""
    from seqmodels.models import check_context_parallel_kind
    from seqmodels.models.kinds import KINDS
    assert all(kind.context_parallel for kind in KINDS.values())
    looped = dataclasses.replace(model_config("attention"), kind="looped")
    check_context_parallel_kind(looped, 4)
    monkeypatch.setitem(KINDS, "looped", dataclasses.replace(KINDS["looped"], context_parallel=False))
    check_context_parallel_kind(looped, 1)
    with pytest.raises(ConfigError, match="mesh.context=4: a looped model \\(model.kind=looped\\) cannot yet run"):
        check_context_parallel_kind(looped, 4)


# (window, num_sinks, context_impl, what crosses devices): "gather-row" an all-gather of the whole row,
# "gather-sinks" an all-gather of C * num_sinks sink tokens, "permute" ppermutes (halo or ring).
SPLIT_FORMS = [(None, 0, "gather", {"gather-row"}), (None, 0, "ring", {"permute"}),
               (12, 2, "gather", {"permute", "gather-sinks"}), (12, 2, "ring", {"permute", "gather-sinks"}),
               (4, 3, "gather", {"permute", "gather-sinks"}), (17, 1, "gather", {"permute", "gather-sinks"}),
               (24, 2, "gather", {"gather-row"}), (12, 0, "gather", {"permute"}), (1, 0, "gather", set())]


@pytest.mark.parametrize("window, num_sinks, context_impl, moved", SPLIT_FORMS)
def test_split_attention_equals_the_whole_row_and_moves_only_what_its_form_needs(window, num_sinks,
                                                                                  context_impl, moved):
    """Rows of ``packed_rows``: documents that start inside a shard and ones that span three and four shards
    (row 0's second document covers tokens 10-34, whose queries in shard 2 see its sinks in shard 0)."""
    from seqmodels.layers.attention import attend_rows
    from seqmodels.layers.context_attention import split_attention
    from seqmodels.models.lm import document_positions
    keys = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(keys[0], (4, LENGTH, 4, 8))
    k, v = (jax.random.normal(key, (4, LENGTH, 2, 8)) for key in keys[1:])
    segments = packed_rows(4)["segment_ids"]
    positions = document_positions(segments)
    rule = dict(window=window, num_sinks=num_sinks, causal=True)
    cotangent = jax.random.normal(jax.random.key(4), q.shape)

    def with_grads(attention, **form):
        def run(q, k, v, segments, positions):
            out = attention(q, k, v, segments, positions, implementation="xla", **rule, **form)
            grads = jax.grad(lambda *qkv: jnp.sum(attention(*qkv, segments, positions, implementation="xla",
                                                            **rule, **form) * cotangent), argnums=(0, 1, 2))(q, k, v)
            return out, grads
        return run

    expected = with_grads(attend_rows)(q, k, v, segments, positions)
    mesh = context_mesh(4)
    split = with_grads(split_attention, context_impl=context_impl)
    with jax.set_mesh(mesh):
        placed = jax.device_put((q, k, v, segments, positions), NamedSharding(mesh, P(None, "context")))
        got = jax.jit(split)(*placed)
        program = jax.jit(lambda *args: split(*args)[0]).lower(*placed).as_text()
    # float32 softmax over at most 64 keys, the same sums in another grouping: 1e-5
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5),
                 got, expected)
    gathers = [line for line in program.splitlines() if "all_gather" in line and "->" in line]
    found = {"gather-row" if f"4x{LENGTH}x2x8" in line else "gather-sinks" for line in gathers if "x2x8" in line}
    found |= {"permute"} if "collective_permute" in program else set()
    assert found == moved, (found, gathers)
    if window is None and context_impl == "ring":  # the forward's rounds r = 1 .. C - 1, each a switch between
        # two half-block branches (the default balanced layout); the program lowered is of the output alone
        assert program.count("stablehlo.case") == 3, program.count("stablehlo.case")


def test_split_attention_by_ring_equals_the_whole_row_bidirectional_and_on_8_shards():
    from seqmodels.layers.attention import attend_rows
    from seqmodels.layers.context_attention import split_attention
    from seqmodels.models.lm import document_positions
    keys = jax.random.split(jax.random.key(5), 3)
    q = jax.random.normal(keys[0], (2, LENGTH, 4, 8))
    k, v = (jax.random.normal(key, (2, LENGTH, 1, 8)) for key in keys[1:])
    segments = packed_rows(2)["segment_ids"]
    positions = document_positions(segments)
    for shards, causal in [(4, False), (8, True)]:
        expected = attend_rows(q, k, v, segments, positions, window=None, num_sinks=0, causal=causal,
                               implementation="xla")
        mesh = context_mesh(shards)
        with jax.set_mesh(mesh):
            placed = jax.device_put((q, k, v, segments, positions), NamedSharding(mesh, P(None, "context")))
            got = jax.jit(lambda *args: split_attention(*args, window=None, num_sinks=0, causal=causal,
                                                        implementation="xla", context_impl="ring"))(*placed)
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_split_attention_refuses_an_unknown_context_impl():
    from seqmodels.layers.context_attention import split_attention
    x = jnp.zeros((1, LENGTH, 1, 8))
    with pytest.raises(ValueError, match="model.attention.context_impl must be one of"):
        split_attention(x, x, x, None, jnp.zeros((1, LENGTH), jnp.int32), window=None, num_sinks=0, causal=True,
                        context_impl="tree")
    with pytest.raises(ConfigError, match="model.attention.context_impl"):
        AttentionConfig(context_impl="tree")


def test_context_impl_is_listed_by_help_config():
    from seqmodels.config_io import help_text
    assert any(line.startswith("model.attention.context_impl = 'gather'") and "ring" in line
               for line in help_text().splitlines())
