"""Resume refuses settings that would not reproduce the run, unless checkpoint.allow_changes names them."""

import json
import re
import shutil

import pytest

import train as train_entry
from conftest import tiny_overrides, write_corpus
from reliability_helpers import logged_steps, one_paragraph_error, snapshot


pytestmark = pytest.mark.xdist_group("resume_settings")  # one worker builds the module's trained run once


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    corpus = str(write_corpus(root / "corpus") / "*.txt")
    run_dir = root / "run"
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=10, checkpoint__every_steps=10)) == 0
    return run_dir, corpus


@pytest.mark.parametrize("change, listed", [
    ({"data__seq_len": 16}, "data.seq_len: checkpoint has 32, config has 16"),
    ({"train__batch_size": 16}, "train.batch_size: checkpoint has 8, config has 16"),
    ({"data__source": "stdlib", "data__path": ""}, "data.source: checkpoint has 'text_files', config has 'stdlib'"),
    ({"train__steps": 20}, "the learning rate is"),
])
def test_changed_setting_on_resume_is_refused_with_the_differences(stopped, tmp_path, capsys, change, listed):
    run_dir, corpus = stopped
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    before = snapshot(copy)
    assert train_entry.main(tiny_overrides(copy, corpus, **{"train__steps": 10, **change})) == 2
    one_paragraph_error(capsys.readouterr().err, "would change settings", listed, "checkpoint.allow_changes=[")
    assert snapshot(copy) == before


def test_allowed_longer_schedule_resumes_and_says_what_the_learning_rate_does(stopped, tmp_path, capsys):
    run_dir, corpus = stopped
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    capsys.readouterr()
    assert train_entry.main(tiny_overrides(copy, corpus, train__steps=14,
                                           checkpoint__allow_changes="[train.steps]")) == 0
    out = capsys.readouterr().out
    assert "train.steps 10 -> 14" in out
    stated = re.search(r"at step 11 the learning rate is (\S+) where the checkpoint's schedule had (\S+)", out)
    assert stated, out
    assert logged_steps(copy) == list(range(1, 15))
    logged = {row["step"]: row["learning_rate"] for row in map(json.loads, (copy / "metrics.jsonl").open())}
    assert float(stated[1]) == float(f"{logged[11]:.4g}")  # the rate step 11 trained with, as logged
    assert float(stated[1]) != float(stated[2])


@pytest.mark.parametrize("allowed, message", [
    ("[model.d_model]", "part of the architecture"),
    ("[train.stepz]", "'train.stepz' is not a config key"),
])
def test_allow_changes_refuses_architecture_and_unknown_keys(stopped, capsys, allowed, message):
    run_dir, corpus = stopped
    before = snapshot(run_dir)
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=10, checkpoint__allow_changes=allowed)) == 2
    one_paragraph_error(capsys.readouterr().err, message)
    assert snapshot(run_dir) == before
