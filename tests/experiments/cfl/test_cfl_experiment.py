"""The CFL experiment as a user runs it: train.py on configs/looped_cfl.yaml, eval.py's cfl suite, the driver
(experiments/cfl/run.py)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cfl import run

ROOT = Path(__file__).resolve().parents[3]
CONFIG = str(ROOT / "configs" / "looped_cfl.yaml")
TINY = ["model.d_model=16", "model.num_heads=2", "data.cfl.max_length=8", "data.seq_len=10",
        "data.cfl.length_buckets=1", "data.cfl.languages=[dyck1, anbn_cmdm]", "train.batch_size=16", "optim.warmup_steps=2",
        "log.progress=never", "log.tensorboard=false", "checkpoint.async_save=false"]


def single_device_env():
    return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")


@pytest.mark.slow
def test_train_py_trains_the_looped_model_on_the_cfl_config_and_eval_py_scores_it(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*TINY, "train.steps=30", "optim.learning_rate=1e-2", "log.every_steps=1", f"train.run_dir={run_dir}"]
    train = subprocess.run([sys.executable, "train.py", "--config", CONFIG, *overrides], cwd=ROOT,
                           env=single_device_env(), capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 30
    # The read-out chooses between <reject> and <accept>: chance, ln 2, at the start (a softmax over all
    # 26 tokens would start at ln 26 = 3.26); below ln 2 only by reading the strings.
    assert abs(losses[0] - math.log(2)) < 0.1
    assert sum(losses[-10:]) / 10 < math.log(2) - 0.05
    evaluate = subprocess.run([sys.executable, "eval.py", "--run", str(run_dir), "--suites", "cfl", "--lengths", "4,8",
                               "--examples", "16", "--batch-size", "16", "--cfl-seed", "7"], cwd=ROOT,
                              env=single_device_env(), capture_output=True, text=True, timeout=600)
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["cfl_seed"] == 7
    result = report["cfl"]
    assert set(result) == {"dyck1", "anbn_cmdm"}
    assert all(0.0 <= cell["accuracy"] <= 1.0 and cell["examples"] == 16
               for cells in result.values() for cell in cells.values())


@pytest.mark.slow
def test_driver_writes_accuracy_per_language_length_and_variant(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    command = [sys.executable, str(ROOT / "experiments" / "cfl" / "run.py"), "--variants", "looped,fixed_compute",
               "--lengths", "4,12", "--examples", "8", "--out", str(out), "--runs", str(runs), *TINY,
               "train.steps=3"]
    result = subprocess.run(command, cwd=ROOT, env=single_device_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((out / "cfl.json").read_text())
    assert set(report["variants"]) == {"looped", "fixed_compute"}
    for variant in report["variants"].values():
        assert set(variant["accuracy"]) == {"dyck1", "anbn_cmdm"}
        for cells in variant["accuracy"].values():
            assert set(cells) == {"4", "12"} and cells["12"]["length"] == 12
        assert [run["languages"] for run in variant["runs"]] == [["dyck1"], ["anbn_cmdm"]]
    # fixed_compute: prelude + loops(8) = 4 distinct blocks + coda, against the looped model's 3 blocks.
    assert report["variants"]["fixed_compute"]["parameters"] > report["variants"]["looped"]["parameters"]
    table = (out / "cfl.md").read_text()
    assert "| dyck1 | looped |" in table and "| anbn_cmdm | fixed_compute |" in table and "12*" in table
    assert (out / "cfl.png").stat().st_size > 10_000


def test_driver_workers_are_single_threaded_and_keep_the_callers_xla_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    env = run.worker_env(tmp_path / "cache")
    assert env["XLA_FLAGS"].startswith(run.SINGLE_THREAD_FLAGS) and env["SEQMODELS_COMPILATION_CACHE"].endswith("cache")
    # A token XLA cannot parse (once a bare "intra_op_parallelism_threads=1") drops the flags after it.
    probe = subprocess.run([sys.executable, "-c", "import jax; print(jax.device_count())"],
                           env=dict(env, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split()[-1] == "2"
