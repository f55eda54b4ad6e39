import jax.numpy as jnp
import pytest

from pallas_kernels import _common


def test_resolve_impl_picks_xla_on_cpu_and_rejects_unknown_names():
    assert _common.resolve_impl("auto") == "xla"
    assert _common.resolve_impl("pallas") == "pallas_triton"
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


def test_an_abstract_gpu_target_selects_compiled_pallas_on_a_cpu_machine():
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

    gpu = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    with use_abstract_mesh(AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=gpu)):
        assert _common.resolve_impl("auto") == "pallas_triton"
        assert not _common.interpret_mode()
    assert _common.interpret_mode()


def test_partition_spec_must_leave_time_unsharded_and_state_spec_drops_it():
    from jax.sharding import PartitionSpec as P

    _common.check_partition_spec(P(("data", "fsdp"), None, "tensor"), 3)
    with pytest.raises(ValueError, match="must not shard the time axis"):
        _common.check_partition_spec(P("data", "fsdp"), 3)
    with pytest.raises(ValueError, match="has 4 entries"):
        _common.check_partition_spec(P(None, None, None, "tensor"), 3)
    assert _common.drop_time_axis(P(("data", "fsdp"), None, "tensor")) == P(("data", "fsdp"), "tensor")
