"""experiments/ruler/learn_format.py: the driver trains and scores one short seed; the committed table is its JSON's."""

import json

import pytest

from experiments.ruler import learn_format as format_experiment


@pytest.mark.slow  # a BPE trained, then a train.py and an eval.py process
def test_the_driver_trains_a_seed_scores_it_on_every_depth_and_writes_its_table(tmp_path):
    out = tmp_path / "format"
    assert format_experiment.main(["--seeds", "0,1", "--steps", "2", "--examples", "1", "--threshold", "0",
                                   "--out", str(out)]) == 0
    results = json.loads((out / "format.json").read_text())
    # threshold 0: the first seed passes, so the second is never trained
    assert [run["seed"] for run in results["runs"]] == [0] and results["learned"] is True
    run = results["runs"][0]
    assert run["prompts"] == 5 and 0.0 <= run["interval"]["low"] <= run["score"] <= run["interval"]["high"] <= 1.0
    assert results["recipe"]["train.steps"] == 2 and results["recipe"]["data.seq_len"] == 191
    assert (out / "format.md").read_text() == format_experiment.markdown(results)


def test_the_committed_table_is_what_the_committed_results_give():
    results = json.loads((format_experiment.RESULTS / "format.json").read_text())
    assert results["steps"] == 800 and [run["prompts"] for run in results["runs"]] == [20] * len(results["runs"])
    assert (format_experiment.RESULTS / "format.md").read_text() == format_experiment.markdown(results)
