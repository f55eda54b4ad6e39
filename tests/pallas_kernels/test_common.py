import jax.numpy as jnp
import pytest

from pallas_kernels import _common


def test_resolve_impl_picks_xla_on_cpu_and_rejects_unknown_names():
    assert _common.resolve_impl("auto") == "xla"
    assert _common.resolve_impl("pallas") == "pallas"
    with pytest.raises(ValueError, match="impl must be one of"):
        _common.resolve_impl("cuda")


@pytest.mark.parametrize("bad", [0, 8, 48, 100, 64.0])
def test_chunk_size_must_be_a_power_of_two_of_at_least_16(bad):
    with pytest.raises(ValueError, match="chunk_size"):
        _common.check_chunk_size(bad)


def test_check_shape_names_argument_layout_and_actual_shape():
    x = jnp.zeros((2, 3, 4))
    _common.check_shape("q", x, (2, None, 4), "[B, T, K]")
    with pytest.raises(ValueError, match=r"q must have shape \[B, T, K\] = \(2, '\?', 5\), got \(2, 3, 4\)"):
        _common.check_shape("q", x, (2, None, 5), "[B, T, K]")


def test_check_float_rejects_integer_arrays():
    with pytest.raises(ValueError, match="beta must be a floating-point array"):
        _common.check_float("beta", jnp.zeros((2,), jnp.int32))
