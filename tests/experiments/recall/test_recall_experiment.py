"""The recall experiment (experiments/recall/run.py) parses its variants and runs end to end on tiny settings."""

import json

import pytest

from experiments.recall import run


def test_variants_and_settings_parse_from_the_command_line():
    assert run.parse_variants("attention, titans=atlas;model.atlas.window=1") == [
        ("attention", "attention", []), ("titans", "atlas", ["model.atlas.window=1"])]
    assert run.parse_variants("t=atlas;model.atlas.eta_range=[0.0, 0.5],swa") == [
        ("t", "atlas", ["model.atlas.eta_range=[0.0, 0.5]"]), ("swa", "swa", [])]
    assert run.parse_settings("64:4,128:8") == [(64, 4), (128, 8)]


@pytest.mark.slow
def test_recall_experiment_writes_accuracy_per_mixer_and_setting(tmp_path):
    assert run.main(["--mixers", "mamba2,two_layer=deltanet;model.deltanet.chunk_size=16", "--settings", "16:2",
                     "--steps", "2", "--batch-size", "8", "--d-model", "16", "--vocab", "16", "--queries", "0",
                     "--eval-batches", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "recall.json").read_text())
    assert [r["variant"] for r in report["results"]] == ["mamba2", "two_layer"]
    for r in report["results"]:  # two steps learn nothing measurable: accuracy is k of the 16 answers scored
        assert r["eval_answers"] == 16 and 0 <= r["accuracy"] * 16 <= 16
        assert r["accuracy"] * 16 == pytest.approx(round(r["accuracy"] * 16), abs=1e-6)
    table = (tmp_path / "recall.md").read_text()
    assert "| mamba2 |" in table and "| two_layer |" in table and "T=16, 2 pairs" in table
