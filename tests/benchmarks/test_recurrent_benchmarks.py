"""The recall, train-step and MuonSSM-cost benchmarks run end to end on tiny settings and write their outputs."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import muonssm_cost  # noqa: E402
import recall  # noqa: E402
import train_step  # noqa: E402


def test_variants_and_settings_parse_from_the_command_line():
    assert recall.parse_variants("attention, titans=atlas;model.atlas.window=1") == [
        ("attention", "attention", []), ("titans", "atlas", ["model.atlas.window=1"])]
    assert recall.parse_variants("t=atlas;model.atlas.eta_range=[0.0, 0.5],swa") == [
        ("t", "atlas", ["model.atlas.eta_range=[0.0, 0.5]"]), ("swa", "swa", [])]
    assert recall.parse_settings("64:4,128:8") == [(64, 4), (128, 8)]


@pytest.mark.slow
def test_recall_benchmark_writes_accuracy_per_mixer_and_setting(tmp_path):
    assert recall.main(["--mixers", "mamba2,two_layer=deltanet;model.deltanet.chunk_size=16", "--settings", "16:2",
                        "--steps", "2", "--batch-size", "8", "--d-model", "16", "--vocab", "16", "--queries", "0",
                        "--eval-batches", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "recall.json").read_text())
    assert [r["variant"] for r in report["results"]] == ["mamba2", "two_layer"]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["eval_answers"] == 16 for r in report["results"])
    table = (tmp_path / "recall.md").read_text()
    assert "| mamba2 |" in table and "| two_layer |" in table and "T=16, 2 pairs" in table


def test_train_step_benchmark_runs_one_tiny_case_through_the_pallas_path(tmp_path):
    out = tmp_path / "train_step.json"
    assert train_step.main(["--small", "--mixers", "mamba2", "--impls", "pallas", "--seq-lens", "32", "--steps", "1",
                            "--warmup", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert "error" not in row, row
    assert row["impl"] == "pallas" and row["batch_size"] == 4 and row["tokens_per_second"] > 0
    assert row["compiled_bytes"] > 0 and 0 < row["loss"] < 10


def test_train_step_ratios_pair_pallas_with_xla_and_transformer():
    rows = [{"mixer": "mamba2", "impl": "pallas", "seq_len": 64, "tokens_per_second": 30.0},
            {"mixer": "mamba2", "impl": "xla", "seq_len": 64, "tokens_per_second": 10.0},
            {"mixer": "attention", "impl": "n/a", "seq_len": 64, "tokens_per_second": 20.0},
            {"mixer": "deltanet", "impl": "pallas", "seq_len": 64, "error": "OOM"}]
    assert train_step.ratios(rows) == [{"mixer": "mamba2", "seq_len": 64, "pallas_over_xla": 3.0,
                                        "pallas_over_transformer": 1.5}]


def test_muonssm_cost_benchmark_reports_the_ratio_to_the_backbone(tmp_path):
    out = tmp_path / "cost.json"
    assert muonssm_cost.main(["--small", "--only", "chunk_gla (xla),momentum_scalar_decay (chunked)",
                              "--out", str(out)]) == 0
    ratios = json.loads(out.read_text())["ratios"]
    assert list(ratios) == ["momentum_scalar_decay / chunk_gla"] and ratios["momentum_scalar_decay / chunk_gla"] > 0
    table = out.with_suffix(".md").read_text()
    assert "| momentum_scalar_decay (chunked) |" in table and "| momentum_scalar_decay / chunk_gla |" in table
    assert "--only" in table  # the command that produced it
