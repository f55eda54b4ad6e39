"""One process per run directory: a live owner refuses a second run by pid and host; a dead owner's lock is taken over."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

import train as train_entry
from conftest import tiny_overrides
from reliability_helpers import ROOT, one_paragraph_error, snapshot, subprocess_env
from seqmodels.training.run_dir import LOCK_NAME, RunDirError, RunDirLock

HOLD = ("import sys, time; from seqmodels.training.run_dir import RunDirLock\n"
        "with RunDirLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n")


def test_second_run_on_a_locked_directory_is_refused_naming_owner(tmp_path, tiny_corpus, capsys):
    run_dir = tmp_path / "run"
    owner = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, env=subprocess_env(),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "held"
        before = snapshot(run_dir)
        assert train_entry.main(tiny_overrides(run_dir, tiny_corpus)) == 2
        one_paragraph_error(capsys.readouterr().err, "in use by another run", f"pid {owner.pid}",
                            f"host {socket.gethostname()}")
        assert snapshot(run_dir) == before
    finally:
        owner.kill()
        owner.wait()


def test_lock_of_a_dead_owner_is_taken_over_with_a_message(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "gone-host", "started": "earlier"}))
    messages = []
    with RunDirLock(run_dir, message=messages.append) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        with pytest.raises(RunDirError, match=f"pid {os.getpid()}"):
            RunDirLock(run_dir).acquire()  # a second holder in this process is refused too (flock per open file)
    assert len(messages) == 1 and "stale lock" in messages[0] and "pid 999999 on host gone-host" in messages[0]
    assert not (run_dir / LOCK_NAME).exists()  # released


def test_lock_of_a_killed_process_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    owner = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, env=subprocess_env(),
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline().strip() == "held"
    owner.kill()  # kill -9: the lock file stays, its flock goes with the process
    owner.wait()
    assert (run_dir / LOCK_NAME).exists()
    messages = []
    with RunDirLock(run_dir, message=messages.append):
        pass
    assert f"pid {owner.pid}" in messages[0] and "stale" in messages[0]


def test_run_directory_that_is_a_file_is_refused(tmp_path, tiny_corpus, capsys):
    path = tmp_path / "run"
    path.write_text("not a directory")
    assert train_entry.main(tiny_overrides(path, tiny_corpus)) == 2
    one_paragraph_error(capsys.readouterr().err, "is a file, not a directory")
    assert path.read_text() == "not a directory"
