"""Every user mistake of the fault-injection list: an `error:` paragraph, exit status 2, nothing overwritten."""

import atexit
import contextlib
import errno
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import eval as eval_entry
import export as export_entry
import train as train_entry
from conftest import tiny_overrides, write_corpus
from reliability_helpers import ROOT, one_paragraph_error, snapshot, subprocess_env
from seqmodels.config import ConfigError, LogConfig
from seqmodels.config_io import load_config
from seqmodels.training.metrics import MetricsLogger


pytestmark = pytest.mark.xdist_group("clean_errors")  # one worker builds the module's trained run once


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    corpus = str(write_corpus(root / "corpus") / "*.txt")
    run_dir = root / "run"
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=5)) == 0
    assert eval_entry.main(["--run", str(run_dir), "--max-batches", "1"]) == 0
    return run_dir, corpus


@pytest.mark.parametrize("override, message", [
    ("mesh.data=3", "multiply to"),
    ("mesh.tensor=3", "cannot be split"),
    ("model.norm_eps=-1", "model.norm_eps: must be > 0"),
    (f"model.d_ff={10**20}", "model.d_ff: 100000000000000000000 does not fit in a 64-bit integer"),
    (f"model.d_ff={2**40}", "model.d_ff: must be <= 1,048,576"),
])
def test_bad_setting_is_refused_before_anything_is_written(tmp_path, tiny_corpus, capsys, override, message):
    before = snapshot(tmp_path)
    assert train_entry.main([*tiny_overrides(tmp_path / "run", tiny_corpus), override]) == 2
    one_paragraph_error(capsys.readouterr().err, message)
    assert snapshot(tmp_path) == before


def test_yaml_scalar_where_a_section_is_expected_is_refused_with_an_override(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("train: 5\n")
    with pytest.raises(ConfigError, match="train: the config file gives 5 where a section"):
        load_config(path, ["train.steps=10"])


def test_pure_transformer_is_not_checked_against_unused_mixer_sections():
    config = load_config(ROOT / "configs" / "transformer.yaml", ["model.d_model=32"])
    assert config.model.d_model == 32
    with pytest.raises(ConfigError, match="model.atlas.poly_key_dim"):
        load_config(None, ["model.d_model=32", "model.num_heads=8", "model.mixers=[atlas]"])


def test_help_config_into_a_closed_pipe_exits_quietly():
    """As ``--help-config | head`` once head has exited: the reader closed the pipe before the write."""
    process = subprocess.Popen([sys.executable, "train.py", "--help-config"], cwd=ROOT, env=subprocess_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=60) == 0 and err == ""


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--lengths", "8,abc", "--suites", "cfl"], "--lengths '8,abc': expected comma-separated integers"),
    (["--suites", ""], "names no suite"),
    (["--suites", "cfl"], "suite 'cfl' needs a run trained on data.source=cfl"),
])
def test_eval_mistakes_are_refused_and_leave_eval_json(trained, capsys, args, message):
    run_dir, _ = trained
    before = snapshot(run_dir)
    assert eval_entry.main(["--run", str(run_dir), *args]) == 2
    one_paragraph_error(capsys.readouterr().err, message)
    assert snapshot(run_dir) == before


@pytest.mark.slow  # trains a looped model first
def test_perplexity_on_a_looped_classifier_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "looped"
    overrides = ["model.kind=looped", "model.d_model=32", "model.num_heads=2", "model.max_seq_len=64",
                 "data.source=cfl", "data.seq_len=24", "data.cfl.max_length=8", "data.cfl.languages=[dyck1]",
                 "train.steps=2", "train.batch_size=8", f"train.run_dir={run_dir}", "log.progress=never",
                 "checkpoint.async_save=false"]
    assert train_entry.main(overrides) == 0
    capsys.readouterr()
    assert eval_entry.main(["--run", str(run_dir)]) == 2
    one_paragraph_error(capsys.readouterr().err, "suite 'perplexity' needs a language model")
    assert not (run_dir / "eval.json").exists()


def test_second_ctrl_c_message_says_what_a_rerun_does(trained, tmp_path):
    run_dir, corpus = trained
    saved = load_config(None, tiny_overrides(run_dir, corpus))
    assert train_entry.interrupted_twice(saved).endswith("resume from the checkpoint at step 5")
    empty = load_config(None, tiny_overrides(tmp_path / "run", corpus))
    (tmp_path / "run" / "checkpoints" / "3.orbax-checkpoint-tmp").mkdir(parents=True)  # a save cut short
    message = train_entry.interrupted_twice(empty)
    assert "no checkpoint of this run directory was ever saved" in message and "resume" not in message
    assert "resume" not in train_entry.interrupted_twice(None)  # interrupted before the config was built


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MB tmpfs, unmounted afterwards. Mounting needs root (as CI runs): where it is refused the
    disk tests fail with the reason, since a skip would pass them without checking anything."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode:
        pytest.fail(f"cannot mount a tmpfs for the disk tests (run them as root, as CI does): {result.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(mount_point, *, leave: int = 0):
    """Fill the file system of ``mount_point`` with one file, then free ``leave`` bytes of it; returns the file."""
    filler = mount_point / "filler"
    with open(filler, "wb", buffering=0) as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 65536)
    with open(filler, "r+b") as handle:
        handle.truncate(max(filler.stat().st_size - leave, 0))
    return filler


def test_full_disk_while_logging_names_the_file_and_starts_no_writer_thread(tmpfs):
    run_dir = tmpfs / "run"
    run_dir.mkdir()
    import tensorboardX  # noqa: F401  (what importing it registers is not a writer's doing)
    threads, exit_hooks = threading.active_count(), atexit._ncallbacks()
    logger = MetricsLogger(run_dir, LogConfig(progress="never", tensorboard=True), total_steps=10**6, start_step=0)
    # TensorBoard events are written where they are logged: no writer thread to print a traceback of its own,
    # no exit hook to fail again (and print) after the run's error.
    assert (threading.active_count(), atexit._ncallbacks()) == (threads, exit_hooks)
    logger.log(1, {"loss": 1.0, "grad_norm": 0.5})
    _fill(tmpfs)
    with pytest.raises(OSError) as raised:
        for step in range(2, 10**6):
            logger.log(step, {"loss": 1.0, "grad_norm": 0.5})
    with contextlib.suppress(OSError):
        logger.close()
    named = {str(run_dir / "metrics.jsonl"), *map(str, (run_dir / "tb").iterdir())}
    assert raised.value.errno == errno.ENOSPC and raised.value.filename in named, raised.value


@pytest.mark.slow
def test_full_disk_while_logging_is_one_error_naming_the_file_and_no_traceback(trained, tmpfs):
    _, corpus = trained
    run_dir = tmpfs / "run"
    _fill(tmpfs, leave=16384)  # room for config.yaml and the first steps' logs
    overrides = tiny_overrides(run_dir, corpus, train__steps=200, checkpoint__every_steps=1000, log__tensorboard=True)
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT, env=subprocess_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    one_paragraph_error(result.stderr, "No space left on device", "its disk has space")
    assert "Traceback" not in result.stderr and "Exception" not in result.stderr
    named = result.stderr.strip().splitlines()[-1].removeprefix("error: ").split(": ")[0]
    assert Path(named).parent in (run_dir, run_dir / "tb"), result.stderr


@pytest.mark.parametrize("tool", ["eval", "export"])
def test_full_disk_under_an_eval_or_export_output_names_it_and_leaves_nothing(trained, tmpfs, capsys, tool):
    run_dir, _ = trained
    _fill(tmpfs, leave=4096)
    before = snapshot(run_dir)
    out = tmpfs / ("results.json" if tool == "eval" else "exported")
    if tool == "eval":
        status = eval_entry.main(["--run", str(run_dir), "--max-batches", "1", "--out", str(out)])
    else:
        status = export_entry.main(["--run", str(run_dir), "--out", str(out)])
    assert status == 2
    one_paragraph_error(capsys.readouterr().err, "No space left on device", str(out))
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]  # no partial output, no staging folder
    assert snapshot(run_dir) == before


def _remount_read_only(mount_point):
    subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)


def test_read_only_run_directory_is_refused_for_training_and_evaluates_elsewhere(trained, tmpfs, tmp_path, capsys):
    run_dir, corpus = trained
    copy = tmpfs / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("tb"))
    _remount_read_only(tmpfs)
    assert train_entry.main(tiny_overrides(copy, corpus, train__steps=10,
                                           checkpoint__allow_changes="[train.steps]")) == 2
    one_paragraph_error(capsys.readouterr().err, "Read-only file system", "choose another train.run_dir")
    out = tmp_path / "elsewhere" / "results.json"
    assert eval_entry.main(["--run", str(copy), "--max-batches", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["step"] == 5
    assert (out.parent / "results_loss_by_position.png").stat().st_size > 1000


@pytest.mark.slow
def test_full_disk_during_a_save_keeps_the_previous_checkpoint(trained, tmpfs, capsys):
    run_dir, corpus = trained
    copy = tmpfs / "run"
    shutil.copytree(run_dir / "checkpoints", copy / "checkpoints")
    shutil.copy(run_dir / "metrics.jsonl", copy / "metrics.jsonl")
    filler = tmpfs / "filler"
    with open(filler, "wb") as handle:  # fill the disk, then free room for the logs but not a checkpoint
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    overrides = tiny_overrides(copy, corpus, train__steps=10, checkpoint__allow_changes="[train.steps]",
                               log__tensorboard=False)
    before = snapshot(copy)
    assert train_entry.main(overrides) == 2  # a run directory on a full disk: refused at its lock file
    one_paragraph_error(capsys.readouterr().err, "the disk is full")
    assert snapshot(copy) == before
    with open(filler, "r+b") as handle:
        handle.truncate(max(filler.stat().st_size - 96 * 1024, 0))
    assert train_entry.main(overrides) == 2
    one_paragraph_error(capsys.readouterr().err, "writing the checkpoint at step 10", "the checkpoint at step 5 is kept")
    filler.unlink()
    # With space again, it resumes from step 5. In a new process, as a user reruns the command: in this one
    # the failed asynchronous save's background writers can still report into the next run's checkpointer.
    resumed = subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT, env=subprocess_env(),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert sorted(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit()) == [5, 10]
