"""experiments/ahn/curve.py: token-weighted block means of the logged KL, a resumed step counted once, no
overwrite."""

import json

import pytest

from experiments.ahn import curve


def write_metrics(run, records):
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))


def test_block_means_weight_each_step_by_its_tokens_and_a_relogged_step_counts_once(tmp_path):
    records = [{"step": 1, "loss": 1.0, "loss_tokens": 100.0, "step_time": 5.0},
               {"step": 2, "loss": 4.0, "loss_tokens": 300.0, "step_time": 5.0},
               {"step": 3, "loss": 9.0, "loss_tokens": 10.0},
               {"step": 3, "loss": 2.0, "loss_tokens": 50.0},  # step 3 again after a resume: this one counts
               {"step": 3, "eval_loss": 7.0}]  # not a training record
    write_metrics(tmp_path / "run", records)
    assert curve.main(["--run", str(tmp_path / "run"), "--block", "2", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "curve.json").read_text())
    assert [step["step"] for step in report["steps"]] == [1, 2, 3]
    first, second = report["blocks"]
    assert first["kl"] == pytest.approx((1.0 * 100 + 4.0 * 300) / 400) and first["tokens"] == 400
    assert (second["first_step"], second["last_step"], second["kl"]) == (3, 3, 2.0)
    assert (tmp_path / "out" / "curve.png").stat().st_size > 0


def test_refuses_an_existing_output_and_a_run_without_metrics(tmp_path):
    write_metrics(tmp_path / "run", [{"step": 1, "loss": 1.0, "loss_tokens": 1.0}])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "curve.png").write_bytes(b"mine")
    with pytest.raises(SystemExit, match="curve.png already exist"):
        curve.main(["--run", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "curve.png").read_bytes() == b"mine"
    with pytest.raises(SystemExit, match="metrics.jsonl does not exist"):
        curve.main(["--run", str(tmp_path / "nowhere"), "--out", str(tmp_path / "other")])
