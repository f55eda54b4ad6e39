"""eval.py and export.py restore the step train.py would resume from, and leave nothing behind when they fail."""

import errno
import json
import shutil
from pathlib import Path

import pytest

import eval as eval_entry
import export as export_entry
from reliability_helpers import one_paragraph_error, snapshot, truncate, truncate_data_files
from seqmodels.runs.checkpoints import RunCheckpoints


DAMAGE = {
    "truncated params chunk": lambda step: truncate_data_files(step / "params" / "ocdbt.process_0" / "d"),
    "deleted params/_METADATA": lambda step: (step / "params" / "_METADATA").unlink(),
    "truncated config/metadata": lambda step: truncate(step / "config" / "metadata"),
}


@pytest.fixture
def run(tiny_trained_run):
    """The session's tiny run (checkpoints at steps 5 and 10; read-only: tests that change it copy it)."""
    return tiny_trained_run[0]


def _copy(run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DAMAGE))
def test_eval_skips_a_damaged_newest_step_with_a_warning_naming_it(run, tmp_path, capsys, name):
    run_dir = _copy(run, tmp_path)
    DAMAGE[name](run_dir / "checkpoints" / "10")
    checkpoints_before = snapshot(run_dir / "checkpoints")
    out = tmp_path / "eval.json"
    assert eval_entry.main(["--run", str(run_dir), "--max-batches", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "warning: skipped the checkpoint at step 10" in captured.err and "using step 5" in captured.err
    assert json.loads(out.read_text())["step"] == 5
    assert snapshot(run_dir / "checkpoints") == checkpoints_before  # a reader renames nothing aside


@pytest.mark.slow
def test_export_skips_a_damaged_newest_step_and_refuses_it_when_asked_for(run, tmp_path, capsys):
    run_dir = _copy(run, tmp_path)
    DAMAGE["truncated params chunk"](run_dir / "checkpoints" / "10")
    out = tmp_path / "hf"
    assert export_entry.main(["--run", str(run_dir), "--out", str(out), "--step", "10"]) == 2
    one_paragraph_error(capsys.readouterr().err, "the checkpoint at step 10", "choose another --step")
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["run"]
    assert export_entry.main(["--run", str(run_dir), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "exported step 5" in captured.out and "skipped the checkpoint at step 10" in captured.err


@pytest.mark.slow
def test_a_step_rotated_out_while_being_read_falls_back_to_the_newest_left(run, tmp_path, capsys, monkeypatch):
    """A live run with checkpoint.keep=1 deletes the step eval is reading: eval takes the next one."""
    run_dir = _copy(run, tmp_path)
    restore = RunCheckpoints.restore_params

    def rotated(self, step, abstract):
        if step == 10:
            shutil.rmtree(self.directory / "10")
        return restore(self, step, abstract)

    monkeypatch.setattr(RunCheckpoints, "restore_params", rotated)
    out = tmp_path / "eval.json"
    assert eval_entry.main(["--run", str(run_dir), "--max-batches", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["step"] == 5
    assert "skipped the checkpoint at step 10" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_out_a_directory_is_refused_before_any_suite_and_leaves_nothing(run, tmp_path, capsys):
    target = tmp_path / "results"
    target.mkdir()
    assert eval_entry.main(["--run", str(run), "--max-batches", "1", "--out", str(target)]) == 2
    one_paragraph_error(capsys.readouterr().err, "is a directory")
    assert list(tmp_path.iterdir()) == [target] and list(target.iterdir()) == []


@pytest.mark.slow
def test_a_failed_write_of_the_results_leaves_no_file(run, tmp_path, capsys, monkeypatch):
    class FullDisk:
        @staticmethod
        def dumps(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(eval_entry, "json", FullDisk)
    out = tmp_path / "eval.json"
    assert eval_entry.main(["--run", str(run), "--max-batches", "1", "--out", str(out)]) == 2
    one_paragraph_error(capsys.readouterr().err, "No space left on device")
    assert list(tmp_path.iterdir()) == []  # neither the JSON, nor the plot, nor a temporary
