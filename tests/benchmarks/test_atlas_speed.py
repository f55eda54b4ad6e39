"""The Atlas speed benchmark: the 125M shape is ~125M parameters, the small run writes sane JSON."""

import json

import pytest

from benchmarks import atlas_speed
from seqmodels.training.state import abstract_model, count_params


@pytest.mark.parametrize("name", ["atlas", "transformer"])
def test_full_shape_models_have_about_125m_parameters(name):
    _, state = abstract_model(atlas_speed.model_config(name, atlas_speed.FULL).model)
    assert 100e6 < count_params(state) < 150e6


@pytest.mark.slow
def test_small_run_times_the_models_it_has_and_skips_the_others(tmp_path):
    out = tmp_path / "speed.json"
    assert atlas_speed.main(["--small", "--models", "transformer,gated_deltanet", "--warmup", "0", "--iters", "1",
                             "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    transformer = report["models"]["transformer"]
    assert transformer["tokens_per_second"] > 0 and transformer["speed_vs_transformer"] == 1.0
    assert report["shape"]["seq_len"] == 64
    other = report["models"]["gated_deltanet"]  # skipped until that mixer is in the build
    assert "skipped" in other or other["tokens_per_second"] > 0


def test_newton_schulz_time_per_step_scales_with_chunks_and_layers():
    config = atlas_speed.model_config("atlas", atlas_speed.SMALL)
    seconds = atlas_speed.time_newton_schulz(config, atlas_speed.SMALL, warmup=1, iters=1)
    assert seconds > 0
