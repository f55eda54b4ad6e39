"""The Atlas speed benchmark: the 125M shape is ~125M parameters, the small run writes sane JSON."""

import json

import pytest

from benchmarks import atlas_speed
from seqmodels.models import abstract_model
from seqmodels.training.state import count_params


@pytest.mark.parametrize("name", ["atlas", "transformer"])
def test_full_shape_models_have_about_125m_parameters(name):
    _, state = abstract_model(atlas_speed.model_config(name, atlas_speed.FULL).model)
    assert 100e6 < count_params(state) < 150e6


@pytest.mark.slow
def test_small_run_times_every_model_it_is_given_against_the_transformer(tmp_path):
    """Both rows measured (Gated DeltaNet is always in the build), each step timed after a compiled warm-up,
    and each row's throughput and speed ratio follow from its step time."""
    out = tmp_path / "speed.json"
    assert atlas_speed.main(["--small", "--models", "transformer,gated_deltanet", "--warmup", "1", "--iters", "1",
                             "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    shape = report["shape"]
    assert shape["seq_len"] == 64
    tokens_per_step = shape["batch"] * shape["seq_len"]
    transformer, other = report["models"]["transformer"], report["models"]["gated_deltanet"]
    assert set(transformer) >= {"params", "step_seconds", "tokens_per_second"}, transformer
    assert set(other) >= {"params", "step_seconds", "tokens_per_second"}, other  # no skipped or error row
    for row in (transformer, other):
        assert row["step_seconds"] > 0
        assert row["tokens_per_second"] == pytest.approx(tokens_per_step / row["step_seconds"], rel=1e-12)
    assert transformer["speed_vs_transformer"] == 1.0
    ratio = other["speed_vs_transformer"]
    assert ratio == pytest.approx(other["tokens_per_second"] / transformer["tokens_per_second"], rel=1e-12)
    # Measured on 2 shared CPU cores: 0.015 (a chunked recurrence at T = 64 against one fused attention).
    # Three orders of magnitude either side is no speed claim, only a broken measurement.
    assert 1e-4 < ratio < 1e2, ratio


@pytest.mark.slow
def test_newton_schulz_time_per_step_is_one_timed_call_times_chunks_times_layers(monkeypatch):
    """The per-step figure is the measured per-call median scaled by chunks x layers: doubling the
    sequence and the layers multiplies the scale by exactly 4."""
    timed = []
    real = atlas_speed._median_seconds
    monkeypatch.setattr(atlas_speed, "_median_seconds", lambda *a: timed.append(real(*a)) or timed[-1])
    config = atlas_speed.model_config("atlas", atlas_speed.SMALL)
    chunk = config.model.atlas.chunk_size
    bigger = {**atlas_speed.SMALL, "seq_len": 2 * atlas_speed.SMALL["seq_len"],
              "layers": 2 * atlas_speed.SMALL["layers"]}
    seconds = [atlas_speed.time_newton_schulz(config, shape, warmup=1, iters=1)
               for shape in (atlas_speed.SMALL, bigger)]
    assert len(timed) == 2 and all(t > 0 for t in timed)
    for shape, total, per_call in zip((atlas_speed.SMALL, bigger), seconds, timed):
        chunks = -(-shape["seq_len"] // chunk)
        assert total == pytest.approx(per_call * chunks * shape["layers"], rel=1e-12)
    assert (seconds[1] / timed[1]) == pytest.approx(4 * seconds[0] / timed[0], rel=1e-12)
