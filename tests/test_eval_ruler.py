"""eval.py --suites ruler on a tiny trained run: JSON, the task x length table, a heatmap per task."""

import json

import pytest

import eval as eval_entry
import train as train_entry
from conftest import tiny_overrides, write_corpus


pytestmark = pytest.mark.xdist_group("ruler")  # one worker builds the module's trained run once


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ruler")
    corpus = str(write_corpus(root / "corpus") / "*.txt")
    run_dir = root / "run"
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=2, model__max_seq_len=512,
                                           checkpoint__every_steps=2)) == 0
    return run_dir


def test_eval_ruler_writes_scores_a_table_and_heatmaps_and_leaves_out_lengths_beyond_the_model(trained_run, capsys):
    out = trained_run / "ruler" / "eval.json"
    assert eval_entry.main(["--run", str(trained_run), "--suites", "ruler", "--lengths", "512,1024",
                            "--ruler-tasks", "niah_single_1,fwe", "--ruler-depths", "0,1", "--ruler-examples", "1",
                            "--batch-size", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "ruler: length 1024 left out: exceeds model.max_seq_len=512" in err
    assert "ruler: niah_single_1 at 512 tokens: " in err and "ruler: fwe at 512 tokens: " in err  # progress per cell
    ruler = json.loads(out.read_text())["ruler"]
    assert ruler["lengths"] == [512] and set(ruler["tasks"]) == {"niah_single_1", "fwe"}
    needle = ruler["tasks"]["niah_single_1"]["by_length"]["512"]
    assert needle["examples"] == 2 and set(needle["by_depth"]) == {"0.0", "1.0"}
    assert ruler["tasks"]["fwe"]["by_length"]["512"]["by_depth"].keys() == {"none"}
    assert ruler["tasks"]["niah_single_1"]["metric"] == "string_match_all"
    table = (out.parent / "eval_ruler.md").read_text()
    assert table.splitlines()[0] == "| task | 512 |" and "| niah_single_1 | " in table
    for task in ("niah_single_1", "fwe"):
        assert (out.parent / f"eval_ruler_{task}.png").stat().st_size > 1000


@pytest.mark.parametrize("flags, message", [
    (["--ruler-tasks", "niah_single_9"], "unknown or no task(s) ['niah_single_9']"),
    (["--ruler-depths", "0,2"], "every depth must be in [0, 1]"),
    (["--lengths", "4096"], "every length exceeds model.max_seq_len=512"),
    (["--ahn-mode", "teacher"], "--ahn-mode teacher needs an AHN run (model.kind=ahn)"),
])
def test_bad_ruler_flags_are_one_line_errors(trained_run, capsys, flags, message):
    out = trained_run / "bad" / "eval.json"
    assert eval_entry.main(["--run", str(trained_run), "--suites", "ruler", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_sweep_evaluation_runs_the_ruler_suite_and_gives_the_loss_an_interval(trained_run):
    from seqmodels.sweeps.evaluate import evaluate_run
    settings = {"suites": ["perplexity", "ruler"], "batch_size": 2, "max_batches": 2,
                "ruler": {"lengths": [512], "tasks": ["niah_single_1"], "depths": [0.5], "per_depth": 2, "seed": 3}}
    results = evaluate_run(trained_run, settings, last_only=True)
    low, high = results["curve"][-1]["loss_interval"]
    assert low <= results["curve"][-1]["loss"] <= high
    assert results["perplexity"]["interval"]["units_are"] == "documents"
    assert results["ruler"]["tasks"]["niah_single_1"]["by_length"]["512"]["examples"] == 2
