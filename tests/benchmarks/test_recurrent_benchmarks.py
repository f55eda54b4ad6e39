"""The train-step and MuonSSM-cost benchmarks run end to end on tiny settings and write their outputs."""

import json

from benchmarks import muonssm_cost, train_step


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
