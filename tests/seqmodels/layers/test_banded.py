"""The banded sliding-window form (``seqmodels.layers.banded``) against the explicit-mask XLA path on
packed rows with per-document sinks: outputs of every real token and the q, k, v gradients, over
windows smaller and larger than the query block, rows not a multiple of it, grouped-query heads,
documents shorter than the sinks and longer than the window, and padding; and where ``auto`` sends
sinks. float32 throughout: the two differ by summation order only (one softmax over the band
against one over the whole row), 2e-5 absolute on O(1) values, plus 2e-6 relative for the gradients of
sink keys, which sum over every query of their document (|dv| up to ~100; float32 rounding of a
sum of that size is ~1e-5 absolute)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqmodels.layers.attention import attend_rows, choose_implementation
from seqmodels.layers.banded import banded_attention

T, H, D = 300, 4, 16
DOCUMENTS = ([2, 150, 40, 3, 87], [3, 297])  # row 0 ends in 18 padding tokens


def _packed_rows():
    segments, positions = np.zeros((2, T), np.int32), np.zeros((2, T), np.int32)
    for row, lengths in enumerate(DOCUMENTS):
        start = 0
        for index, length in enumerate(lengths):
            segments[row, start:start + length] = index + 1
            positions[row, start:start + length] = np.arange(length)
            start += length
    return jnp.asarray(segments), jnp.asarray(positions)


def _inputs(kv_heads):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (2, T, H, D))
    k, v = (jax.random.normal(key, (2, T, kv_heads, D)) for key in keys[1:])
    return q, k, v


def _value_and_grads(attention, q, k, v, segments):
    real = (segments != 0)[..., None, None]
    weights = jnp.cos(jnp.arange(D, dtype=jnp.float32))

    def loss(q, k, v):
        out = attention(q, k, v)
        return jnp.sum(jnp.where(real, out, 0.0) * weights), jnp.where(real, out, 0.0)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)


@pytest.mark.slow
@pytest.mark.parametrize(("window", "num_sinks", "block_size", "kv_heads"), [
    (5, 4, 32, 2),     # window well inside a block; many blocks; rows end mid-block (300 = 9 * 32 + 12)
    (40, 4, 32, 2),    # window larger than a block: the slice spans two blocks before the queries
    (100, 4, 128, 1),  # the default block, one key/value head for four query heads
    (200, 8, 64, 4),   # window past the 150-token document; more sinks than two documents have tokens
    (64, 0, 128, 2),   # no sinks: the plain banded window
])
def test_banded_matches_the_masked_path_forward_and_backward(window, num_sinks, block_size, kv_heads):
    q, k, v = _inputs(kv_heads)
    segments, positions = _packed_rows()
    banded = lambda q, k, v: banded_attention(q, k, v, segments, positions, window=window, num_sinks=num_sinks,
                                              block_size=block_size)
    masked = lambda q, k, v: attend_rows(q, k, v, segments, positions, window=window, num_sinks=num_sinks,
                                         causal=True, implementation="xla")
    (_, out), grads = _value_and_grads(banded, q, k, v, segments)
    (_, expected_out), expected_grads = _value_and_grads(masked, q, k, v, segments)
    np.testing.assert_allclose(out, expected_out, atol=2e-5, rtol=0)
    for name, grad, expected in zip("qkv", grads, expected_grads):
        np.testing.assert_allclose(grad, expected, atol=2e-5, rtol=2e-6, err_msg=f"d{name}")


@pytest.mark.slow
def test_the_sinks_change_the_output_so_the_comparison_sees_them():
    """With a 5-token window the sinks are most of what a late query of a long document sees: the
    masked path with and without them differs, and banded follows the one with them."""
    q, k, v = _inputs(2)
    segments, positions = _packed_rows()
    real = (segments != 0)[..., None, None]
    masked = {sinks: attend_rows(q, k, v, segments, positions, window=5, num_sinks=sinks, causal=True,
                                 implementation="xla") for sinks in (0, 4)}
    banded = attend_rows(q, k, v, segments, positions, window=5, num_sinks=4, causal=True, implementation="banded")
    assert float(jnp.max(jnp.abs(jnp.where(real, masked[4] - masked[0], 0.0)))) > 0.1
    np.testing.assert_allclose(jnp.where(real, banded, 0.0), jnp.where(real, masked[4], 0.0), atol=2e-5, rtol=0)


@pytest.mark.slow
def test_rows_without_segment_ids_are_one_document_each():
    q, k, v = _inputs(2)
    out = attend_rows(q, k, v, None, None, window=7, num_sinks=2, causal=True, implementation="banded")
    expected = attend_rows(q, k, v, None, None, window=7, num_sinks=2, causal=True, implementation="xla")
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=0)


def test_banded_refuses_full_context_and_kernels_refuse_sinks_naming_banded():
    q = jnp.zeros((1, 256, 2, 16))
    segments = jnp.ones((1, 256), jnp.int32)
    with pytest.raises(ValueError, match="sliding-window attention"):
        attend_rows(q, q, q, segments, None, window=None, num_sinks=0, causal=True, implementation="banded")
    with pytest.raises(ValueError, match="sliding-window attention"):
        attend_rows(q, q, q, segments, None, window=8, num_sinks=0, causal=False, implementation="banded")
    for implementation in ("splash", "flash"):
        with pytest.raises(ValueError, match="implementation=banded"):
            attend_rows(q, q, q, segments, None, window=64, num_sinks=4, causal=True, implementation=implementation)
    with pytest.raises(ValueError, match="window"):
        banded_attention(q, q, q, segments, segments, window=0)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        banded_attention(q, q[:, :, :1].repeat(3, axis=2), q[:, :, :1].repeat(3, axis=2), segments, segments, window=4)
    with pytest.raises(ValueError, match="integer"):
        banded_attention(q, q, q, segments.astype(jnp.float32), segments, window=4)


@pytest.mark.parametrize(("platform", "length", "packed", "window", "num_sinks", "expected"), [
    ("tpu", 512, True, 64, 4, "banded"),    # sinks: splash has no mask for them
    ("tpu", 500, True, 64, 0, "banded"),    # a window over rows splash cannot block (not a multiple of 128)
    ("tpu", 512, True, 64, 0, "splash"),
    ("tpu", 500, True, None, 0, "auto"),    # full context over ragged rows: the masked path
    ("gpu", 512, True, 64, 4, "banded"),
    ("gpu", 512, False, 64, 4, "banded"),   # cuDNN has no sinks either
    ("gpu", 512, True, 64, 0, "flash"),
    ("gpu", 512, False, 64, 0, "auto"),     # cuDNN's local window, jax's choice
    ("cpu", 512, True, 64, 4, "auto"),
])
def test_auto_sends_sinks_to_banded_on_tpu_and_gpu(platform, length, packed, window, num_sinks, expected):
    assert choose_implementation("auto", platform, length=length, packed=packed, window=window,
                                 num_sinks=num_sinks, causal=True) == expected


@pytest.mark.parametrize(("platform", "kind"), [("tpu", "TPU v5 lite"), ("gpu", "NVIDIA H200")])
def test_auto_lowers_sinks_without_a_row_by_row_matrix_on_tpu_and_gpu(platform, kind):
    """On an abstract TPU / GPU target, ``auto`` over packed rows with sinks lowers to the banded form
    (no [512, 512] array anywhere); the explicit-mask path, for contrast, has one."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    device = AbstractDevice(device_kind=kind, num_cores=1, platform=platform)
    q = jax.ShapeDtypeStruct((1, 512, 2, 64), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((1, 512), jnp.int32)

    def lowered(implementation):
        attend = lambda q, k, v, s, p: attend_rows(q, k, v, s, p, window=64, num_sinks=4, causal=True,
                                                   implementation=implementation)
        with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
            return jax.jit(attend).trace(q, q, q, rows, rows).lower(
                lowering_platforms=("tpu" if platform == "tpu" else "cuda",)).as_text()
    assert "512x512" not in lowered("auto") and "512x512" in lowered("xla")


def test_bfloat16_rows_stay_bfloat16_and_match_the_masked_path():
    """Both paths score in float32 and weigh bfloat16 values with bfloat16 probabilities; they differ
    by the rounding of those sums: 3e-2 absolute (a few bfloat16 ulps of O(1) outputs)."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _inputs(2))
    segments, positions = _packed_rows()
    real = (segments != 0)[..., None, None]
    out = attend_rows(q, k, v, segments, positions, window=40, num_sinks=4, causal=True, implementation="banded")
    expected = attend_rows(q, k, v, segments, positions, window=40, num_sinks=4, causal=True, implementation="xla")
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(jnp.where(real, out, 0).astype(jnp.float32),
                               jnp.where(real, expected, 0).astype(jnp.float32), atol=3e-2, rtol=0)
