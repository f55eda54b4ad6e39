"""Multi-process training over JAX's CPU collectives: 2 processes x 2 devices equal 1 process x 4 devices."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seqmodels.launch import cluster_detected, process_environment
from conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("launch")  # one worker: the two processes need both cores


MQAR = dict(data__source="mqar", data__synthetic__vocab_size=32, data__synthetic__num_pairs=4, model__vocab_size=32)


def run(overrides, *, processes: int, expect: int = 0):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    if processes == 1:
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        command = [sys.executable, str(ROOT / "train.py"), *overrides]
    else:
        command = [sys.executable, "-m", "seqmodels.launch", "--processes", str(processes), "--devices-per-process",
                   str(4 // processes), "--timeout", "500", "--", str(ROOT / "train.py"), *overrides]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def losses(run_dir) -> dict:
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), "metrics.jsonl has a step twice: only process 0 may write it"
    return {r["step"]: r["loss"] for r in records}


def assert_same_losses(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-6 * max(1.0, abs(a[step])), (step, a[step], b[step])


@pytest.mark.slow
@pytest.mark.parametrize("mesh, source", [((-1, 1, 1), "stdlib"), ((1, 4, 1), "jsonl"), ((1, 2, 2), "token_ids"),
                                          ((1, 1, 4), "mqar")],
                         ids=["data-stdlib", "fsdp-jsonl", "fsdp_x_tensor-token_ids", "tensor_across_processes-mqar"])
def test_two_processes_train_as_one_with_four_devices(tmp_path, tiny_corpus, mesh, source):
    # The global batch of step s holds the same rows however the processes split it: MQAR rows are a function of
    # (seed, example index), and a packed source's documents are packed into rows that each process draws in full
    # and keeps its own of. So the runs must agree up to the order of float reductions.
    data = {"stdlib": dict(data__source="stdlib"),
            "jsonl": dict(data__source="jsonl", data__path=str(jsonl_corpus(tmp_path))),
            "token_ids": dict(data__source="token_ids", data__path=token_ids_corpus(tmp_path)),
            "mqar": MQAR}[source]
    extra = dict(mesh__data=mesh[0], mesh__fsdp=mesh[1], mesh__tensor=mesh[2], train__steps=10,
                 checkpoint__every_steps=10, model__num_heads=4, **data)
    one = run(tiny_overrides(tmp_path / "one", tiny_corpus, **extra), processes=1)
    two = run(tiny_overrides(tmp_path / "two", tiny_corpus, **extra), processes=2)
    assert "[process 1]" in two.stdout + two.stderr
    assert_same_losses(losses(tmp_path / "one"), losses(tmp_path / "two"))
    assert len(losses(tmp_path / "two")) == 10


def run_one(overrides, *, devices: int, expect: int = 0):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def assert_close_losses(a: dict, b: dict, tolerance: float = 1e-5):
    assert sorted(a) == sorted(b)
    for step in a:
        assert abs(a[step] - b[step]) <= tolerance * max(1.0, abs(a[step])), (step, a[step], b[step])


def jsonl_corpus(tmp_path) -> Path:
    import random
    rng = random.Random(1)
    path = tmp_path / "docs.jsonl"
    words = ["alpha", "beta", "gamma", "delta", "x", "y", "return", "value"]
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(3, 60)))}) + "\n"
                            for _ in range(40)))
    return path


def token_ids_corpus(tmp_path) -> str:
    from seqmodels.data.builders.prepare import main as prepare_main
    argv = ["--input", str(jsonl_corpus(tmp_path)), "--tokenizer", "byte", "--output", str(tmp_path / "ids"),
            "--shards", "2", "--workers", "1"]
    assert prepare_main(argv) == 0
    return str(tmp_path / "ids" / "*.array_record")


@pytest.mark.slow
def test_a_checkpoint_of_two_processes_resumes_in_one_and_in_two(tmp_path, tiny_corpus):
    extra = dict(train__steps=10, checkpoint__every_steps=5, checkpoint__async_save=False)
    run(tiny_overrides(tmp_path / "whole", tiny_corpus, **extra), processes=2)
    run(tiny_overrides(tmp_path / "split", tiny_corpus, train__exit_at_step=5, **extra), processes=2)
    resumed = run(tiny_overrides(tmp_path / "split", tiny_corpus, **extra), processes=1)
    assert "step 5 was saved by 2 process(es) x 4 devices" in resumed.stdout + resumed.stderr
    assert "resuming on 1 process(es) x 4 devices" in resumed.stdout + resumed.stderr
    assert_close_losses(losses(tmp_path / "whole"), losses(tmp_path / "split"))


@pytest.mark.slow
def test_four_devices_then_two_then_one_resume_as_the_uninterrupted_run(tmp_path, tiny_corpus):
    extra = dict(train__steps=9, checkpoint__every_steps=3, checkpoint__async_save=False, mesh__data=-1)
    run_one(tiny_overrides(tmp_path / "whole", tiny_corpus, **extra), devices=4)
    for devices, stop in ((4, 3), (2, 6), (1, 9)):
        run_one(tiny_overrides(tmp_path / "moved", tiny_corpus, train__exit_at_step=stop, **extra), devices=devices)
    assert_close_losses(losses(tmp_path / "whole"), losses(tmp_path / "moved"))


def test_only_a_process_of_several_joins_a_cluster():
    assert not cluster_detected({})
    assert not cluster_detected({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"})
    assert cluster_detected({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"})
    assert cluster_detected({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert cluster_detected({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"})
    assert not cluster_detected({"TPU_WORKER_HOSTNAMES": "localhost"})
    env = process_environment(1, 2, 3, 4321, environ={"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"})
    assert env["JAX_PROCESS_ID"] == "1" and env["JAX_NUM_PROCESSES"] == "2"
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:4321"
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=3"


def test_the_launcher_refuses_a_missing_command_and_a_bad_process_count():
    result = subprocess.run([sys.executable, "-m", "seqmodels.launch", "--processes", "0", "--", "train.py"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "processes must be an int >= 1" in result.stderr


def test_a_lost_process_is_declared_within_the_configured_heartbeat_timeout():
    from seqmodels.launch import cluster_timeouts
    assert cluster_timeouts({}) == {"heartbeat_timeout_seconds": 10, "shutdown_timeout_seconds": 30}
    assert cluster_timeouts({"SEQMODELS_HEARTBEAT_TIMEOUT": "3"})["heartbeat_timeout_seconds"] == 3
    with pytest.raises(ValueError, match="SEQMODELS_SHUTDOWN_TIMEOUT='0' must be a whole number of seconds >= 1"):
        cluster_timeouts({"SEQMODELS_SHUTDOWN_TIMEOUT": "0"})


CHILD = """
import os, signal, sys, time
index = int(os.environ["JAX_PROCESS_ID"])
signal.signal(signal.SIGTERM, lambda *_: (print(f"SIGTERM reached {index}", flush=True), sys.exit(3)))
print(f"pid {os.getpid()}", flush=True)
if index == 1 and sys.argv[1] == "die":
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_process_makes_the_launcher_stop_the_other_and_report_128_plus_the_signal(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    command = [sys.executable, "-m", "seqmodels.launch", "--processes", "2", "--grace", "0.5", "--",
               str(tmp_path / "child.py"), "die"]
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                            text=True, timeout=30)
    assert time.monotonic() - started < 10
    assert result.returncode == 137, result.stderr
    assert "launch: process 1 was killed by signal 9; stopping the others" in result.stderr
    assert "[process 0] SIGTERM reached 0" in result.stdout


def test_children_of_a_launcher_killed_by_sigkill_die_with_it(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    launcher = subprocess.Popen([sys.executable, "-m", "seqmodels.launch", "--processes", "2", "--",
                                 str(tmp_path / "child.py"), "live"], cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    pids = [int(launcher.stdout.readline().split()[-1]) for _ in range(2)]
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
