"""pallas_kernels.atlas_memory under impl="pallas_tpu" (and "pallas_triton", the same sweep as a Triton kernel on
zero-padded power-of-two blocks): the fused chunk-sweep kernel (Pallas interpreter on CPU) with
the chunk-recompute backward equals the reference oracle (outputs, final memory and momentum, gradients of every
input, the norm gain and M_0) across chunk sizes, windows, memory depths, packed documents and float32/bf16; it
continues from a state and returns one; decoding continues from its state; it runs shard-local under a mesh; its
Mosaic lowering runs without a TPU."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from test_atlas_memory import (BATCH, CASES, HEADS, LENGTH, _relative_error, assert_split_row_continues,
                               chunk_settings_for, evaluate, evaluate_with_memory, reference, scale_tolerance,
                               settings_for)

from pallas_kernels.atlas_memory import AtlasInputs, AtlasSettings, atlas_memory, atlas_memory_step

pytestmark = pytest.mark.xdist_group("atlas_memory")  # one worker: the reference's jitted programs are reused

FUSED = "pallas_tpu"  # the Mosaic kernel's family; on CPU it runs in the Pallas interpreter
TRITON = "pallas_triton"  # the Triton kernel's family; on CPU it runs in the Pallas interpreter too


def assert_matches(got, want, tolerance, what):
    """Every leaf within ``tolerance`` times the largest entry of its expected value."""
    for index, (actual, expected) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        scale = max(float(np.abs(expected).max()), 1e-6)
        np.testing.assert_allclose(actual, expected, atol=tolerance * scale, rtol=0, err_msg=f"{what} leaf {index}")


fused_form = functools.partial(atlas_memory, impl=FUSED)


@functools.cache
def final_memory(impl):
    """jit of ``atlas_memory(..., return_memory=True)`` by ``impl``: one program per settings and shapes."""
    return jax.jit(functools.partial(atlas_memory, impl=impl, return_memory=True), static_argnums=2)


def assert_fused_matches_reference(inputs, initial, settings, impl=FUSED):
    """Outputs and final memory within ``scale_tolerance`` (float32, NS amplifying rounding: test_atlas_memory), the
    gradients of ``sum(y w)`` within twice that: they are the ``xla`` chunk's own autodiff (exactly: the backward
    from the ``xla`` forward's boundary states equals the ``xla`` form's gradients to the last bit), but taken along
    the kernel's trajectory, whose float32 rounding differs (another summation order for G, NS on the Gram side);
    NS's Jacobian magnifies that difference as its forward does (measured with Polar Express: 1.5x the tolerance
    against the oracle where the xla form is at 0.85x; with muon both at 0.5x)."""
    y, grads = evaluate(functools.partial(atlas_memory, impl=impl), inputs, initial, settings)
    y_ref, grads_ref = evaluate(reference, inputs, initial, settings)
    tolerance = scale_tolerance(settings)
    assert np.abs(np.asarray(y_ref)).max() > 0.1  # the memory produced real outputs
    assert_matches(y, y_ref, tolerance, "y")
    assert_matches(grads, grads_ref, 2 * tolerance, "gradients")
    assert float(np.abs(grads_ref[1][0]).max()) > 0  # gradients reach the initial memory
    memories = [final_memory(impl)(inputs, initial, settings)[1] for impl in (impl, "reference")]
    assert_matches(*memories, tolerance, "final memory")


# Each runs the oracle's scan and its autodiff and the kernel in the Pallas interpreter: 10-60 s on 2 busy cores.
FAST_CASES = {"linear-p1-c6-b4-k0"}
# deep-p2-c3-b4-k5 (deep memory, muon NS on eta-scaled gradients, window 3) repeats paths of the kernel that the
# others take (deep: the polar and clip cases; muon: deep-p2-c3-b4-k5-norm; eta on the gradient: the k0 cases);
# the fused split test below still checks it against the reference, outputs and gradients.
KERNEL_CASES = sorted(set(CASES) - {"deep-p2-c3-b4-k5"})


@pytest.mark.parametrize("case", [name if name in FAST_CASES else pytest.param(name, marks=pytest.mark.slow)
                                  for name in KERNEL_CASES])
def test_fused_kernel_matches_the_reference_outputs_final_memory_and_gradients(case):
    """The token rule over ragged rows of packed documents (row 0: three documents, one starting mid-chunk,
    then padding): linear and deep memories, windows 1 to 6 across chunks of 2 and 4, clip, norm, NS schedules."""
    assert_fused_matches_reference(*settings_for(case))


@pytest.mark.parametrize("chunk_size", [1, pytest.param(16, marks=pytest.mark.slow)])
def test_fused_kernel_matches_the_reference_at_other_chunk_sizes(chunk_size):
    """b = 1 (the online rule), 16 (one chunk holds the row). (The window of 6 reaching two chunks back, once
    b = 3's case here, is linear-p1-c6-b4-k0's at b = 4 in the test above: 5 carried tokens over two chunks.)"""
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    assert_fused_matches_reference(inputs, initial, dataclasses.replace(settings, chunk_size=chunk_size))


@pytest.mark.slow  # the fast tier guards the Triton kernel by its lowering (test_triton_lowering)
def test_triton_kernel_matches_the_reference_outputs_final_memory_and_gradients():
    """The Triton sweep pads every block to a power of two >= 16 (here chunks of 4 to 16 rows, the window's 2
    carried tokens to 16, V = 4 and F = 13 to 16 columns, E = 8 to 16): the padding is inert, with a deep memory
    and its LayerNorm over the true value columns, the carried tokens placed by their positions before the chunk.
    (linear-p1-c6-b4-k0's case here took the same carried-window path, 5 tokens padded to 16; the linear memory
    in the Triton sweep, its window reaching back over several chunks, is the chunks-of-one test's below.)"""
    assert_fused_matches_reference(*settings_for("deep-p2-c3-b4-k5-norm"), impl=TRITON)


@pytest.mark.slow
def test_triton_kernel_writes_every_kth_boundary_state_at_chunks_of_one_token():
    """Chunks of 1 over 10 tokens (one real row of 16, K = 2): the kernel's outer loop writes the start state of
    every second chunk, from which the backward recomputes its segments; against the reference (the case of
    the Mosaic kernel's test of the same, whose oracle run this one reuses)."""
    from pallas_kernels.atlas_memory import fused
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    settings = dataclasses.replace(settings, chunk_size=1)
    assert fused.segment_length(LENGTH) == 2
    assert_fused_matches_reference(inputs, initial, settings, impl=TRITON)


@pytest.mark.slow
def test_chunk_granularity_runs_the_recompute_backward_and_matches_its_reference():
    """ns_granularity = "chunk" has no kernel: its forward is the xla chunk in the fused scan (boundary states
    kept), its backward the same chunk recomputed; both equal the token-by-token reference of that rule
    (outputs, final memory, and the gradients of an objective of both)."""
    inputs, initial, settings = chunk_settings_for("linear-c6-b4-k5-gradient")
    y, memory, grads = evaluate_with_memory(FUSED, inputs, initial, settings)
    y_ref, memory_ref, grads_ref = evaluate_with_memory("reference", inputs, initial, settings)
    tolerance = scale_tolerance(settings)  # the xla form's own (test_atlas_memory): the same arithmetic
    assert_matches((y, memory, grads), (y_ref, memory_ref, grads_ref), tolerance, "y, memory, gradients")


def eight_tokens(inputs):
    return AtlasInputs(*(x[:, :8] for x in inputs[:8]), inputs.norm_gain)


@pytest.mark.parametrize("case", ["linear-p1-c6-b4-k0", pytest.param("deep-p2-c3-b4-k5", marks=pytest.mark.slow)])
def test_return_state_holds_the_reference_memory_momentum_and_window(case):
    """Two chunks of 4 over packed documents: the state after the row (memory, momentum, the window's last c - 1
    tokens)."""
    inputs, initial, settings = settings_for(case)
    inputs = eight_tokens(inputs)
    run = functools.partial(atlas_memory, return_state=True)
    _, state = jax.jit(functools.partial(run, impl=FUSED), static_argnums=2)(inputs, initial, settings)
    _, want = jax.jit(functools.partial(run, impl="reference"), static_argnums=2)(inputs, initial, settings)
    tolerance = scale_tolerance(settings)
    assert float(np.abs(want["momentum"][0]).max()) > 1e-3  # a momentum to compare
    for name in ("memory", "momentum"):
        assert_matches(state[name], want[name], tolerance, name)
    for name in ("window_keys", "window_values", "window_weights"):  # the oldest entry, which the next token
        assert_matches(state[name][:, 1:], want[name][:, 1:], tolerance, name)  # drops, is 0 in the chunked form
    assert int(state["position"]) == int(want["position"]) == 8


@pytest.mark.slow  # two compiles of forward and backward (the reference's shared with the test above)
@pytest.mark.parametrize("case", ["linear-p1-c6-b4-k0", "deep-p2-c3-b4-k5"])
def test_a_row_split_at_a_chunk_boundary_continues_from_the_fused_state(case):
    """The row run as three parts (cut after 4 and after 8 tokens), each from the state of the one before, equals
    the row run whole: outputs and gradients, which flow back through the states' memory, momentum and window."""
    inputs, initial, settings = settings_for(case)
    assert_split_row_continues(FUSED, inputs, initial, settings, assert_matches)


@pytest.mark.slow  # ~17 s
def test_decoding_from_the_fused_state_equals_the_training_forward():
    """Training forward over 8 tokens returns the cache; decoding the last 2 from it gives the whole row's outputs."""
    inputs, initial, settings = settings_for("deep-p2-c3-b4-k5")
    one_document = inputs._replace(segment_ids=jnp.ones_like(inputs.segment_ids))
    whole = jax.jit(functools.partial(atlas_memory, impl=FUSED), static_argnums=2)(one_document, initial, settings)
    _, state = atlas_memory(eight_tokens(one_document), initial, settings, impl=FUSED, return_state=True)
    state, y_tail = atlas_memory_step(state, jax.tree.map(lambda x: x[:, 8:], one_document), initial, settings,
                                      impl="xla")
    tolerance = scale_tolerance(settings)  # Newton-Schulz in the kernel against the xla form's, fp32
    np.testing.assert_allclose(y_tail, whole[:, 8:], atol=tolerance * float(np.abs(whole).max()), rtol=0)
    assert int(state["position"]) == LENGTH


@pytest.mark.slow  # ~21 s: three forms with their gradients
def test_bf16_newton_schulz_in_the_kernel_matches_the_reference_in_bf16():
    """ns_dtype = bfloat16: the kernel's NS on bf16 operands follows the oracle run with the same ns_dtype within
    the bounds that test_atlas_memory's bf16 test justifies for the xla form (bf16 rounding of each token's
    momentum, amplified by the NS steps and compounded along the row), and is a bf16 computation."""
    inputs, initial, settings = settings_for("linear-p2-c2-b4-k5-update")
    half = dataclasses.replace(settings, ns_dtype="bfloat16")
    y, memory, grads = evaluate_with_memory(FUSED, inputs, initial, half)
    y_ref, memory_ref, grads_ref = evaluate_with_memory("reference", inputs, initial, half)
    y_fp32, _, grads_fp32 = evaluate_with_memory("reference", inputs, initial, settings)
    assert _relative_error(y, y_ref) < 5e-2
    assert _relative_error(y, y_fp32) > 1e-3
    for got, want in zip(memory, memory_ref):
        assert _relative_error(got, want) < 5e-2
    for got, want, exact in zip(*(jax.tree.leaves(g) for g in (grads, grads_ref, grads_fp32))):
        assert _relative_error(got, want) < max(0.5, 1.5 * _relative_error(want, exact)), got.shape


@pytest.mark.slow
def test_sharded_over_batch_and_heads_matches_unsharded():
    """4 simulated devices, rows over data and heads over tensor: the fused scan runs shard-local (shard_map)."""
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    spec = PartitionSpec("data", None, "tensor")

    def objective(floats, initial, spec):
        y = atlas_memory(AtlasInputs(*floats, inputs.segment_ids), initial, settings, impl=FUSED,
                         partition_spec=spec)
        return jnp.sum(y * jnp.sin(jnp.arange(y.size, dtype=jnp.float32).reshape(y.shape))), y

    grad = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)
    (_, expected), expected_grads = jax.jit(grad, static_argnums=2)(tuple(inputs[:7]), initial, None)
    mesh = jax.make_mesh((BATCH, HEADS), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[:BATCH * HEADS])
    with jax.set_mesh(mesh):
        floats = tuple(jax.device_put(x, NamedSharding(mesh, spec)) for x in inputs[:7])
        (_, y), grads = jax.jit(grad, static_argnums=2)(floats, initial, spec)
    assert y.sharding.spec[0] == "data"
    assert_matches(y, expected, 1e-5, "y")  # float32, the same arithmetic per (row, head)
    assert_matches(grads, expected_grads, 1e-5, "gradients")


def test_the_kernel_writes_every_kth_boundary_state_that_the_backward_recomputes_from(monkeypatch):
    """Chunks of 1 over 10 tokens: the backward keeps the start states of every K-th chunk (K = 2, which the
    kernel alone writes) or of every chunk (K = 1, forced). The recomputed segments start from the kept states,
    so the gradients agree to float32 rounding, and both hold to the reference."""
    from pallas_kernels.atlas_memory import fused
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    settings = dataclasses.replace(settings, chunk_size=1)
    assert fused.segment_length(LENGTH) == 2
    y, grads = evaluate(fused_form, inputs, initial, settings)
    monkeypatch.setattr(fused, "segment_length", lambda num_chunks: 1)
    y_all, grads_all = evaluate(fused_form, inputs, initial, settings)
    assert_matches(y, y_all, 1e-6, "y")
    assert_matches(grads, grads_all, 1e-5, "gradients")
    y_ref, grads_ref = evaluate(reference, inputs, initial, settings)
    assert_matches(grads, grads_ref, 2 * scale_tolerance(settings), "gradients against the reference")


def test_the_fused_kernel_lowers_to_mosaic_without_a_tpu():
    """With an abstract TPU as the target, ``auto`` picks the fused sweep and Pallas's Mosaic lowering of it (and
    of the Newton-Schulz kernel in the recompute backward) runs on CPU without libtpu, at Mosaic-legal blocks:
    chunk 64, F = V = E = 128; at chunk 4 (not a block of 8 rows) the forward is the xla chunk."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    from pallas_kernels.atlas_memory import MemoryLayout
    layout = MemoryLayout(128, 128, 128)
    settings = AtlasSettings(layout, window=4, chunk_size=64, ns_steps=5, eta_scales="update")
    sequence = jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.float32)
    gate = jax.ShapeDtypeStruct((1, 128, 2), jnp.float32)
    initial = tuple(jax.ShapeDtypeStruct((2, m, n), jnp.float32) for m, n in layout.shapes)

    def loss(floats, initial):
        y = atlas_memory(AtlasInputs(*floats, jnp.ones((1, 128), jnp.int32)), initial, settings, impl="auto")
        return jnp.sum(y * y)

    device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
        traced = jax.jit(jax.grad(loss, argnums=(0, 1))).trace((sequence,) * 3 + (gate,) * 4, initial)
        text = traced.lower(lowering_platforms=("tpu",)).as_text()
    assert "atlas_memory_chunk_sweep_tpu" in text
    assert text.count("tpu_custom_call") >= 2  # the sweep, and Newton-Schulz in the backward
    # Chunks of 4 rows are no Mosaic block: the same backward, with the xla chunk as the forward.
    settings = dataclasses.replace(settings, chunk_size=4)
    with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
        traced = jax.jit(jax.grad(loss, argnums=(0, 1))).trace((sequence,) * 3 + (gate,) * 4, initial)
        text = traced.lower(lowering_platforms=("tpu",)).as_text()
    assert "atlas_memory_chunk_sweep_tpu" not in text and "tpu_custom_call" in text
