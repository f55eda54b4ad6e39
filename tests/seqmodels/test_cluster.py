"""A run of several processes under signals and deaths: the launcher, one agreed stop, a lost process."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tiny_overrides, write_corpus
from seqmodels.launch import exit_status, process_environment

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("launch")]  # one worker: the processes need both cores
STEPS = 24


def environment() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    return env


def start(run_dir, corpus, *, processes: int = 2, **extra) -> subprocess.Popen:
    overrides = tiny_overrides(run_dir, corpus, **{"train__steps": STEPS, "checkpoint__every_steps": 100, **extra})
    command = [sys.executable, "-m", "seqmodels.launch", "--processes", str(processes), "--devices-per-process",
               str(4 // processes), "--timeout", "300", "--", str(ROOT / "train.py"), *overrides]
    return subprocess.Popen(command, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def logged(run_dir) -> dict:
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return {}
    records = [json.loads(line) for line in lines if line.strip()]
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return {r["step"]: r["loss"] for r in records}


def wait_for_steps(launcher, run_dir, count: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(logged(run_dir)) < count:
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"fewer than {count} steps logged in {timeout} s"
        time.sleep(0.01)


def children(launcher) -> dict[int, int]:
    """``{process index: pid}`` of the launcher's trainers."""
    pids = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    found = {}
    for pid in map(int, pids):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        index = next(int(v.split(b"=")[1]) for v in env if v.startswith(b"JAX_PROCESS_ID="))
        found[index] = pid
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def assert_same_losses(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-6 * max(1.0, abs(a[step])), (step, a[step], b[step])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return str(write_corpus(tmp_path_factory.mktemp("cluster") / "corpus") / "*.txt")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus):
    """One uninterrupted run of 2 processes x 2 devices: its losses."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    launcher = start(run_dir, corpus)
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    losses = logged(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def test_exit_statuses_read_as_a_shell_reads_them():
    assert exit_status(0) == 0 and exit_status(3) == 3
    assert exit_status(-signal.SIGKILL) == 137 and exit_status(-signal.SIGABRT) == 134


@pytest.mark.parametrize("process", [0, 1])
def test_sigterm_to_one_process_stops_both_at_one_step_and_the_resume_matches(tmp_path, corpus, reference, process):
    """The coordinator (process 0) or the other one is signalled, at a random moment of a random step. (Three random
    seeds once chose the process too; the two processes are the two paths, the moment is drawn as before.)"""
    rng = random.Random(process)
    run_dir = tmp_path / "run"
    launcher = start(run_dir, corpus)
    wait_for_steps(launcher, run_dir, rng.randint(2, STEPS - 8))
    time.sleep(rng.uniform(0.0, 0.05))
    os.kill(children(launcher)[process], signal.SIGTERM)
    signalled = time.monotonic()
    out, err = launcher.communicate(timeout=60)
    assert time.monotonic() - signalled < 60
    assert launcher.returncode == 3, err[-3000:]
    stopped = {int(i): int(s) for i, s in re.findall(r"\[process (\d)\] stopped by .* after step (\d+) \(exit status 3\)",
                                                     err)}
    assert sorted(stopped) == [0, 1] and len(set(stopped.values())) == 1, err[-3000:]
    step = stopped[0]
    assert "on another process" in err
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [step]
    resumed = start(run_dir, corpus)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert_same_losses(logged(run_dir), reference)


def test_kill_9_of_one_process_ends_the_launcher_within_30_s_leaving_nothing(tmp_path, corpus):
    run_dir = tmp_path / "run"
    launcher = start(run_dir, corpus, train__steps=500)
    wait_for_steps(launcher, run_dir, 3)
    pids = children(launcher)
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    out, err = launcher.communicate(timeout=30)
    assert time.monotonic() - killed < 30
    assert launcher.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert "launch: process 1 was killed by signal 9; stopping the others" in err
    assert not any(alive(pid) for pid in pids.values())


def test_sigterm_to_the_launcher_reaches_every_process_which_exit_3(tmp_path, corpus):
    run_dir = tmp_path / "run"
    launcher = start(run_dir, corpus, train__steps=500)
    wait_for_steps(launcher, run_dir, 3)
    pids = children(launcher)
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 3, err[-3000:]
    assert all(f"[process {i}] stopped by SIGTERM after step" in err for i in (0, 1)), err[-3000:]
    assert not any(alive(pid) for pid in pids.values())


def test_a_lost_process_stops_the_others_within_seconds_naming_it(tmp_path, corpus):
    """Without the launcher (as on a cluster): the survivor learns of the loss from the coordination service."""
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, corpus, train__steps=500, checkpoint__every_steps=100)
    from seqmodels.launch import free_port
    port = free_port()
    trainers = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT,
                                 env=process_environment(i, 2, 2, port, environ=environment()),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        deadline = time.monotonic() + 240
        while len(logged(run_dir)) < 3:
            assert all(t.poll() is None for t in trainers) and time.monotonic() < deadline
            time.sleep(0.01)
        trainers[1].kill()
        killed = time.monotonic()
        _, err = trainers[0].communicate(timeout=60)
        latency = time.monotonic() - killed
    finally:
        for trainer in trainers:
            trainer.kill()
            trainer.communicate()
    assert trainers[0].returncode != 0
    assert latency < 25, latency  # the heartbeat timeout (10 s) and the time to notice it
    assert re.search(r"tasks are unhealthy \(stopped sending heartbeats\):\s*1\b", err), err[-3000:]
