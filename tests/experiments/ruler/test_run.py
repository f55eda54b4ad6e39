"""experiments/ruler/run.py: the score table per variant, task and length, and the score-by-length plot."""

import pytest

from experiments.ruler import run


def cell(score, low, high):
    return {"score": score, "interval": {"low": low, "high": high}}


def evaluation(scores):
    """A run's ``eval`` with niah_single_1 at 256 and 512 (``scores``), 512 skipped for niah_multikey_1."""
    return {"ruler": {"tasks": {
        "niah_single_1": {"by_length": {"256": cell(scores[0], 0.0, 1.0), "512": cell(scores[1], 0.1, 0.3)}},
        "niah_multikey_1": {"by_length": {"256": cell(0.5, 0.2, 0.8), "512": {"skipped": "too short"}}}}}}


RESULTS = {"eval": {"ruler": {"per_depth": 2, "depths": [0, 1], "seed": 42}},
           "variants": [{"name": "one_seed", "overrides": ["data.seq_len=255"],
                         "runs": [{"eval": evaluation([1.0, 0.2])}]},
                        {"name": "two_seeds", "runs": [{"eval": evaluation([0.4, 0.0])}, {"eval": evaluation([0.8, 0.5])}]},
                        {"name": "not_run", "runs": [{"status": "not run"}]}]}


def test_one_seed_keeps_its_interval_and_two_seeds_give_their_mean_and_range():
    one = run.variant_scores(RESULTS["variants"][0])
    assert one["niah_single_1"][512] == {"score": 0.2, "low": 0.1, "high": 0.3, "seeds": 1}
    assert 512 not in one["niah_multikey_1"]  # a skipped cell is left out, not scored 0
    two = run.variant_scores(RESULTS["variants"][1])
    assert two["niah_single_1"][256] == {"score": 0.6000000000000001, "low": 0.4, "high": 0.8, "seeds": 2}
    assert run.variant_scores(RESULTS["variants"][2]) == {}


def test_the_training_length_is_read_from_the_recorded_overrides():
    assert run.train_length(RESULTS) == 256
    with pytest.raises(ValueError, match="records no data.seq_len override"):
        run.train_length({"variants": [{"overrides": ["model.d_model=8"]}]})


def test_the_table_has_a_row_per_variant_and_task_with_lengths_as_multiples_and_the_plot_is_written(tmp_path):
    table = run.markdown(RESULTS, 256)
    lines = table.splitlines()
    assert lines[0] == "| variant | seeds | task | 256 (1x) | 512 (2x) |"
    assert "| one_seed | 1 | niah_single_1 | 1.00 [0.00, 1.00] | 0.20 [0.10, 0.30] |" in lines
    assert "| one_seed | 1 | niah_multikey_1 | 0.50 [0.20, 0.80] | – |" in lines
    assert "| two_seeds | 2 | niah_single_1 | 0.60 [0.40, 0.80] | 0.25 [0.00, 0.50] |" in lines
    assert any(line.startswith("| not_run | 0 | (no evaluation) |") for line in lines)
    assert "2 examples per depth at depths [0, 1], prompt seed 42; trained on rows of 256 tokens" in table
    assert run.plot(RESULTS, 256, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
    nothing_evaluated = {**RESULTS, "variants": [RESULTS["variants"][2]]}
    assert not run.plot(nothing_evaluated, 256, tmp_path / "none.png") and not (tmp_path / "none.png").exists()
