"""A damaged newest checkpoint: the run falls back to the newest complete one, bitwise, and renames the bad one aside."""

import shutil

import pytest

import train as train_entry
from conftest import tiny_overrides, write_corpus
from reliability_helpers import (assert_same_params, final_params, logged_losses, one_paragraph_error, snapshot,
                                truncate, truncate_data_files)


CORRUPTIONS = {
    "truncated params chunk": (lambda step: truncate_data_files(step / "params" / "ocdbt.process_0" / "d"),
                               "step 10"),
    "truncated opt_state chunk": (lambda step: truncate_data_files(step / "opt_state" / "ocdbt.process_0" / "d"),
                                  "step 10"),
    "deleted params/_METADATA": (lambda step: (step / "params" / "_METADATA").unlink(), "params/_METADATA is missing"),
    "deleted data state": (lambda step: (step / "data" / "process_0-of-1.json").unlink(),
                           "data/process_0-of-1.json is missing"),
    "truncated config/metadata": (lambda step: truncate(step / "config" / "metadata"),
                                  "config/metadata is not readable JSON"),
    "removed params/": (lambda step: shutil.rmtree(step / "params"), "params/ is missing"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run stopped at step 10 (checkpoints 5 and 10) and the same run trained straight to step 15."""
    root = tmp_path_factory.mktemp("corrupt")
    corpus = str(write_corpus(root / "corpus") / "*.txt")
    stopped, straight = root / "stopped", root / "straight"
    assert train_entry.main(tiny_overrides(stopped, corpus, train__steps=15, train__exit_at_step=10)) == 0
    assert train_entry.main(tiny_overrides(straight, corpus, train__steps=15)) == 0
    return root, corpus, stopped, straight


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one_bitwise(runs, name, tmp_path, capsys):
    _, corpus, stopped, straight = runs
    run_dir = tmp_path / "run"
    shutil.copytree(stopped, run_dir)
    damage, reason = CORRUPTIONS[name]
    damage(run_dir / "checkpoints" / "10")
    capsys.readouterr()
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=15)) == 0
    out = capsys.readouterr().out
    assert "warning: the checkpoint at step 10 is incomplete" in out and reason in out, out
    assert "resuming from step 5" in out
    assert (run_dir / "checkpoints" / "10.incomplete").is_dir()  # renamed aside, never deleted
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["10", "10.incomplete", "15", "5"]
    step, params = final_params(run_dir)
    assert step == 15
    assert_same_params(params, final_params(straight)[1])
    assert logged_losses(run_dir) == logged_losses(straight)


@pytest.mark.slow
def test_no_complete_checkpoint_is_refused_and_nothing_is_written(runs, tmp_path, capsys):
    _, corpus, stopped, _ = runs
    run_dir = tmp_path / "run"
    shutil.copytree(stopped, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "5")
    (run_dir / "checkpoints" / "10" / "params" / "_METADATA").unlink()
    before = snapshot(run_dir)
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=15)) == 2
    one_paragraph_error(capsys.readouterr().err, "no complete checkpoint", "step 10: params/_METADATA is missing",
                        "Nothing was changed")
    assert snapshot(run_dir) == before
