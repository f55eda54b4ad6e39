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


def test_several_runs_are_compared_on_the_rows_they_share_by_the_ratio_of_their_mean_kls(tmp_path):
    tokens = [100.0, 300.0, 200.0, 400.0]
    first = [2.0, 1.0, 3.0, 1.5]
    write_metrics(tmp_path / "gdn", [{"step": s + 1, "loss": kl, "loss_tokens": n}
                                     for s, (kl, n) in enumerate(zip(first, tokens))])
    # the second run is worse by half on every row, and logged one step fewer: three steps are shared
    write_metrics(tmp_path / "mamba2", [{"step": s + 1, "loss": 1.5 * kl, "loss_tokens": n}
                                        for s, (kl, n) in enumerate(zip(first[:3], tokens[:3]))])
    assert curve.main(["--run", str(tmp_path / "gdn"), "--run", str(tmp_path / "mamba2"), "--block", "2",
                       "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "curve.json").read_text())
    assert set(report["runs"]) == {"gdn", "mamba2"} and len(report["runs"]["gdn"]["blocks"]) == 2
    (entry,) = report["paired"]
    shared_kl = (2.0 * 100 + 1.0 * 300 + 3.0 * 200) / 600
    assert (entry["run"], entry["against"], entry["steps"], entry["last_step"]) == ("mamba2", "gdn", 3, 3)
    assert entry["reference_kl"] == pytest.approx(shared_kl) and entry["kl"] == pytest.approx(1.5 * shared_kl)
    # a constant ratio on every row: every resample has it, so the interval is that one point
    assert entry["ratio"] == pytest.approx(1.5)
    assert entry["interval"]["low"] == pytest.approx(1.5) and entry["interval"]["high"] == pytest.approx(1.5)
    assert entry["interval"]["units"] == 3
    assert curve.main(["--run", str(tmp_path / "gdn"), "--run", str(tmp_path / "mamba2"), "--paired-from", "2",
                       "--out", str(tmp_path / "later")]) == 0
    (later,) = json.loads((tmp_path / "later" / "curve.json").read_text())["paired"]
    assert (later["steps"], later["first_step"]) == (2, 2)
    assert later["reference_kl"] == pytest.approx((1.0 * 300 + 3.0 * 200) / 500)


def test_runs_that_saw_different_rows_or_share_a_name_are_refused(tmp_path, capsys):
    write_metrics(tmp_path / "gdn", [{"step": 1, "loss": 1.0, "loss_tokens": 100.0}])
    write_metrics(tmp_path / "other", [{"step": 1, "loss": 1.0, "loss_tokens": 90.0}])
    with pytest.raises(SystemExit, match="did not see the same rows and windows"):
        curve.main(["--run", str(tmp_path / "gdn"), "--run", str(tmp_path / "other"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
    (tmp_path / "copy").mkdir()
    with pytest.raises(SystemExit):
        curve.main(["--run", str(tmp_path / "gdn"), "--run", str(tmp_path / "copy" / ".." / "gdn"),
                    "--out", str(tmp_path / "o")])
    assert "must have different names" in capsys.readouterr().err and not (tmp_path / "o").exists()
