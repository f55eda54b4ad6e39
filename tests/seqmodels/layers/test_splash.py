"""Splash attention (the TPU kernel) and flash attention (the Triton kernels), here in Pallas
interpret mode, against the explicit-mask path on packed rows: outputs of every real token and all
gradients, for causal, sliding-window and bidirectional rules; and which kernel ``auto`` picks. float32 throughout; the two differ by summation order only (online softmax
over 128-key blocks against one softmax): 2e-5 absolute on O(1) values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqmodels.layers.attention import attend_rows

B, T, H, HKV, D = 2, 256, 4, 2, 32


def _packed_rows():
    """Row 0: documents of 100 and 100 tokens, then 56 padding tokens; row 1: documents of 30 and 226."""
    segments = np.ones((B, T), np.int32)
    segments[0, 100:], segments[0, 200:], segments[1, 30:] = 2, 0, 2
    positions = np.zeros((B, T), np.int32)
    for t in range(1, T):
        positions[:, t] = np.where(segments[:, t] == segments[:, t - 1], positions[:, t - 1] + 1, 0)
    return jnp.asarray(segments), jnp.asarray(positions)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["splash", "flash"])
@pytest.mark.parametrize(("window", "causal"), [(None, True), (40, True), (None, False)])
def test_kernels_match_the_masked_path_on_packed_rows_forward_and_backward(implementation, window, causal):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (B, T, H, D))
    k, v = (jax.random.normal(key, (B, T, HKV, D)) for key in keys[1:])
    segments, positions = _packed_rows()
    real = (segments != 0)[..., None, None]
    weights = jnp.cos(jnp.arange(D, dtype=jnp.float32))

    def run(implementation):
        def loss(q, k, v):
            out = attend_rows(q, k, v, segments, positions, window=window, num_sinks=0, causal=causal,
                              implementation=implementation)
            return jnp.sum(jnp.where(real, out, 0.0) * weights), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, out), grads = run(implementation)
    (_, expected_out), expected_grads = run("xla")
    np.testing.assert_allclose(jnp.where(real, out, 0.0), jnp.where(real, expected_out, 0.0), atol=2e-5, rtol=0)
    for name, grad, expected in zip("qkv", grads, expected_grads):
        np.testing.assert_allclose(grad, expected, atol=2e-5, rtol=0, err_msg=f"d{name}")


def test_splash_refuses_sinks_and_ragged_lengths_with_the_setting_to_change():
    q = jnp.zeros((1, 256, 2, 16))
    segments = jnp.ones((1, 256), jnp.int32)
    with pytest.raises(ValueError, match="model.attention.implementation=banded"):
        attend_rows(q, q, q, segments, None, window=64, num_sinks=4, causal=True, implementation="splash")
    short = jnp.zeros((1, 200, 2, 16))
    with pytest.raises(ValueError, match="multiple of 128"):
        attend_rows(short, short, short, segments[:, :200], None, window=None, num_sinks=0, causal=True,
                    implementation="splash")


@pytest.mark.parametrize(("platform", "kind", "marker"), [("tpu", "TPU v5 lite", "tpu_custom_call"),
                                                          ("gpu", "NVIDIA H200", "__gpu$xla.gpu.triton")])
def test_auto_attends_packed_rows_with_the_platforms_kernel(platform, kind, marker):
    """On an abstract TPU / GPU target, ``auto`` over rows with segment ids lowers to splash / the
    Triton flash kernels, not to a [T, T] mask."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    device = AbstractDevice(device_kind=kind, num_cores=1, platform=platform)
    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((1, 256), jnp.int32)
    attend = lambda q, k, v, s, p: attend_rows(q, k, v, s, p, window=None, num_sinks=0, causal=True)
    with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
        text = jax.jit(attend).trace(q, q, q, rows, rows).lower(
            lowering_platforms=("tpu" if platform == "tpu" else "cuda",)).as_text()
    assert marker in text and "256x256" not in text
