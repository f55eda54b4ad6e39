"""The FLOPs registry behind MFU: formulas checked against parameter counts and enumeration."""

import jax
import pytest
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.mixers.attention import SlidingWindowConfig, mean_visible_keys
from seqmodels.models import build_model
from seqmodels.models.lm import lm_flops_per_token
from seqmodels.training.flops import mfu


@pytest.mark.parametrize("seq_len, window, sinks", [(1, None, 0), (10, None, 0), (10, 3, 0), (10, 3, 2), (4, 8, 1)])
def test_mean_visible_keys_matches_enumeration(seq_len, window, sinks):
    def visible(t):
        if window is None:
            return t + 1
        return min(t + 1, window + sinks)
    expected = sum(visible(t) for t in range(seq_len)) / seq_len
    assert mean_visible_keys(seq_len, window, sinks) == pytest.approx(expected)


def test_lm_flops_are_two_per_matmul_parameter_plus_attention_scores():
    config = ModelConfig(d_model=64, num_heads=4, mixers=("attention", "swa"), tie_embeddings=False,
                         swa=SlidingWindowConfig(window=8))
    model = build_model(config)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    matmul_params = params["head"].size + sum(
        leaf.size for block in params["blocks"].values()
        for part in ("mixer", "mlp") for leaf in jax.tree.leaves(block[part]) if leaf.ndim >= 2)
    seq_len = 32
    scores = 4 * config.d_model * (mean_visible_keys(seq_len, None) + mean_visible_keys(seq_len, 8))
    assert lm_flops_per_token(config, seq_len) == pytest.approx(2 * matmul_params + scores)


def test_mfu_counts_training_as_three_forward_passes():
    assert mfu(tokens_per_second=1000, forward_flops_per_token=1e6, peak_per_device=1e10, num_devices=2) == \
        pytest.approx(3 * 1e9 / 2e10)



@pytest.mark.parametrize("kind, bf16", [("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
                                        ("TPU v5p", 459e12), ("TPU v6 lite", 918e12), ("TPU v4", 275e12),
                                        ("NVIDIA H200", 989e12)])
def test_each_accelerator_gets_its_own_datasheet_peak(kind, bf16):
    from seqmodels.training.flops import peak_for_kind
    assert peak_for_kind(kind, "bfloat16") == bf16
    assert peak_for_kind(kind, "float32") < bf16


def test_an_unlisted_device_has_no_datasheet_peak():
    from seqmodels.training.flops import peak_for_kind
    assert peak_for_kind("cpu", "float32") is None
