"""experiments/needle/run.py --merge: new rows join the existing needle.json only when the settings agree."""

import json

import pytest

from experiments.needle import run

SETTINGS = ["--seq-len", "16", "--steps", "3", "--batch-size", "2", "--per-depth", "1", "--depths", "0,1"]


def _fake_result(accuracy: float) -> dict:
    length = {"accuracy": accuracy, "by_depth": {0.0: accuracy, 1.0: accuracy}}  # float keys, as scored
    return {"train_seconds": 1.0, "last_loss": 0.5, "by_length": {f"{f}x": dict(length) for f in (1, 2, 4)}}


@pytest.fixture
def fake_training(monkeypatch):
    accuracies = {"transformer": 0.25, "titans": 0.5, "atlas": 0.75}
    monkeypatch.setattr(run, "run_model", lambda name, args, depths: _fake_result(accuracies[name]))


def test_merge_adds_the_new_model_and_keeps_the_others(tmp_path, fake_training):
    out = ["--out", str(tmp_path)]
    assert run.main(["--models", "transformer,titans", *SETTINGS, *out]) == 0
    assert run.main(["--models", "atlas", "--merge", *SETTINGS, *out]) == 0
    report = json.loads((tmp_path / "needle.json").read_text())
    assert list(report["models"]) == ["transformer", "titans", "atlas"]
    assert report["models"]["titans"]["by_length"]["2x"]["accuracy"] == 0.5
    assert "| atlas | 0.75 | 0.75 | 0.75 |" in (tmp_path / "needle.md").read_text()


def test_without_merge_the_table_is_replaced(tmp_path, fake_training):
    out = ["--out", str(tmp_path)]
    assert run.main(["--models", "transformer", *SETTINGS, *out]) == 0
    assert run.main(["--models", "atlas", *SETTINGS, *out]) == 0
    assert list(json.loads((tmp_path / "needle.json").read_text())["models"]) == ["atlas"]


def test_merge_refuses_different_settings_before_training(tmp_path, monkeypatch, fake_training):
    out = ["--out", str(tmp_path)]
    assert run.main(["--models", "transformer", *SETTINGS, *out]) == 0
    monkeypatch.setattr(run, "run_model", lambda *a: pytest.fail("trained despite differing settings"))
    with pytest.raises(ValueError, match="'steps' is 4 here but 3"):
        run.main(["--models", "atlas", "--merge", *SETTINGS[:2], "--steps", "4", *SETTINGS[4:], *out])
