"""Preemption: SIGTERM / SIGINT save and exit with status 3; kill -9 at random moments of async saves resumes bitwise."""

import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import tiny_overrides, write_corpus
from reliability_helpers import (ROOT, assert_same_params, final_params, logged_losses, logged_steps, run_script,
                                 start_train, subprocess_env)

EXIT_PREEMPTED = 3


def _wait_for_line(process, fragment: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if fragment in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"{fragment!r} never printed; stderr: {process.stderr.read()[-2000:]}")


def _rows(run_dir) -> list[str]:
    try:
        return (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return str(write_corpus(tmp_path_factory.mktemp("signals") / "corpus") / "*.txt")


# train.py with the first step's trace held open: it announces itself on stderr and waits for the release
# file. The test's signal therefore always lands inside the first step's compile, however loaded the machine is.
_HELD_FIRST_COMPILE = """
import os, sys, time
sys.path.insert(0, {root!r})
import seqmodels.training.loop as loop
real_make_train_step = loop.make_train_step
def held_make_train_step(*args, **kwargs):
    step = real_make_train_step(*args, **kwargs)
    def held_step(*step_args):
        os.write(2, b"first step compiling, held open\\n")
        while not os.path.exists({release!r}):
            time.sleep(0.02)
        return step(*step_args)
    return held_step
loop.make_train_step = held_make_train_step
sys.argv = ["train.py", *sys.argv[1:]]
import train
sys.exit(train.main())
"""


@pytest.fixture
def reaped():
    """The runs a test starts (it appends them), killed at its end if still running: a failed test leaves no
    run behind to hold a core for the rest of the suite."""
    processes = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def _start_with_stderr_lines(script: str, overrides, reaped):
    """The process and a list its stderr lines are appended to as they come (a reader thread)."""
    process = subprocess.Popen([sys.executable, "-c", script, *overrides], cwd=ROOT, env=subprocess_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reaped.append(process)
    lines = []
    threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True).start()
    return process, lines


def _wait_for_stderr(process, lines, fragment, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(fragment in line for line in lines):
        assert process.poll() is None, "".join(lines)[-2000:]
        time.sleep(0.01)
    assert any(fragment in line for line in lines), f"{fragment!r} never printed: {''.join(lines)[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_first_compile_saves_step_one_and_exits_preempted(tmp_path, corpus, signum, reaped):
    run_dir, release = tmp_path / "run", tmp_path / "release"
    overrides = tiny_overrides(run_dir, corpus, train__steps=200, checkpoint__every_steps=100)
    process, lines = _start_with_stderr_lines(
        _HELD_FIRST_COMPILE.format(root=str(ROOT), release=str(release)), overrides, reaped)
    _wait_for_stderr(process, lines, "first step compiling, held open", 240)
    process.send_signal(signum)
    _wait_for_stderr(process, lines, f"{signum.name} received: stopping after this step", 120)
    release.touch()
    out = process.stdout.read()
    process.wait(timeout=120)
    err = "".join(lines)
    assert process.returncode == EXIT_PREEMPTED, err[-2000:]
    assert "Traceback" not in err and f"stopped by {signum.name}" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["1"]
    assert f"{signum.name} received: checkpoint saved at step 1" in out, out[-2000:]
    assert logged_steps(run_dir) == [1]


@pytest.mark.slow
def test_kill_9_at_random_moments_of_async_saves_resumes_bitwise(tmp_path, corpus, reaped):
    """Three seeds pick a moment (after 3..27 logged steps, plus 0-50 ms); each killed run resumes bitwise."""
    steps = 30
    straight = tmp_path / "straight"
    result = run_script("train.py", *tiny_overrides(straight, corpus, train__steps=steps, checkpoint__every_steps=3,
                                                    checkpoint__async_save=True))
    assert result.returncode == 0, result.stderr[-2000:]
    for seed in range(3):
        run_dir = tmp_path / f"killed_{seed}"
        overrides = tiny_overrides(run_dir, corpus, train__steps=steps, checkpoint__every_steps=3,
                                   checkpoint__async_save=True)
        rng = random.Random(seed)
        kill_after_rows = rng.randint(3, steps - 3)
        process = start_train(overrides)
        reaped.append(process)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(_rows(run_dir)) < kill_after_rows and process.poll() is None:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.05))  # somewhere in or between the asynchronous saves (every 3 steps)
        process.kill()
        process.wait()
        assert process.returncode == -9, "the run ended before it was killed"
        resumed = run_script("train.py", *overrides)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert logged_steps(run_dir) == list(range(1, steps + 1))  # one row per step, none twice
        assert logged_losses(run_dir) == logged_losses(straight)
        step, params = final_params(run_dir)
        assert step == steps
        assert_same_params(params, final_params(straight)[1])


# train.py with Checkpointer.save held open: it announces itself on stderr, then waits. The second SIGINT
# therefore always lands inside the save that the first one asked for, however loaded the machine is.
_HELD_SAVE = """
import os, sys, time
sys.path.insert(0, {root!r})
import seqmodels.training.checkpoint as checkpoint
def held_save(self, *args, **kwargs):
    os.write(2, b"save held open\\n")
    while True:
        time.sleep(0.05)
checkpoint.Checkpointer.save = held_save
sys.argv = ["train.py", *sys.argv[1:]]
import train
sys.exit(train.main())
"""


@pytest.mark.slow
def test_second_sigint_stops_at_once_with_status_130(tmp_path, corpus, reaped):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, corpus, train__steps=100000, checkpoint__every_steps=100000)
    # stdout is not read here: a pipe nobody drains could fill and block the run's last messages
    process = subprocess.Popen([sys.executable, "-c", _HELD_SAVE.format(root=str(ROOT)), *overrides], cwd=ROOT,
                               env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reaped.append(process)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()

    def wait_for(fragment, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(fragment in line for line in lines):
            assert process.poll() is None, "".join(lines)[-2000:]
            time.sleep(0.01)
        assert any(fragment in line for line in lines), f"{fragment!r} never printed: {''.join(lines)[-2000:]}"

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(_rows(run_dir)) < 2:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    wait_for("save held open", 120)  # the first SIGINT was seen and the run is inside its checkpoint
    process.send_signal(signal.SIGINT)
    process.wait(timeout=120)
    reader.join(timeout=30)
    err = "".join(lines)
    assert process.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: interrupted twice") and "Traceback" not in err
    assert "no checkpoint of this run directory was ever saved" in last and "resume" not in last  # none was saved
    assert "SIGINT received: stopping after this step" in err
