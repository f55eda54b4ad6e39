"""Running a sweep's (variant, seed) runs: train.py, then the evaluation, each in its own process.

Run ``(variant, seed)`` lives in ``runs/sweeps/NAME/VARIANT/seed<S>/`` (train.py's run directory,
``train.log`` and ``eval.log`` beside its checkpoints) and records its outcome in ``sweep_run.json``
there: ``status`` is ``done`` (trained to the budget and evaluated), ``time_limit`` (stopped by the
sweep's ``time_limit_minutes``; its last checkpoint alone is evaluated, under the same limit), ``interrupted`` (train.py
stopped by SIGINT / SIGTERM after saving a checkpoint; not evaluated), or ``failed`` (with the error).
A run whose settings changed since its checkpoint (an edited sweep file) is refused by train.py and
reported as failed with train.py's message: give it another ``name`` or remove its run directory.

Resuming: a run whose ``sweep_run.json`` says ``done`` for the same command is skipped; any other
run is started again with the same command, and train.py resumes it from its newest checkpoint
(an interrupted run continues, a finished training goes straight to evaluation).

Each process runs single-threaded on CPU (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``, ``OPENBLAS_NUM_THREADS=1``) so that ``--jobs N`` runs share N cores
without oversubscribing them. A run stopped by the time limit gets SIGTERM: train.py saves a
checkpoint of its last step and exits with status 3.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from seqmodels.sweeps.spec import Sweep, Variant

EXIT_PREEMPTED = 3  # train.py: stopped by a signal after saving a checkpoint
SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
STATUS_FILE = "sweep_run.json"
STOP_GRACE_S = 600  # train.py honours SIGTERM between steps; a run still in a step this long after it is killed


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One (variant, seed) run of a sweep: its directory and the exact commands."""

    variant: Variant
    seed: int
    run_dir: Path
    train_command: tuple[str, ...]
    eval_command: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.variant.name}/seed{self.seed}"


def checkpoint_interval(steps: int, points: int) -> int:
    """Steps between checkpoints so that about ``points`` of them are evaluated along training."""
    return max(1, math.ceil(steps / points))


def run_specs(sweep: Sweep, runs_root: Path, python: str = sys.executable) -> list[RunSpec]:
    """Every (variant, seed) run of ``sweep``, variants in file order, then seeds."""
    specs = []
    for variant in sweep.variants:
        every = checkpoint_interval(variant.steps, sweep.eval.points)
        for seed in variant.seeds or sweep.seeds:
            run_dir = runs_root / sweep.name / variant.name / f"seed{seed}"
            train = (python, "train.py", "--config", variant.config_path, *variant.overrides,
                     f"train.run_dir={run_dir}", f"train.steps={variant.steps}", f"train.seed={seed}",
                     f"data.seed={seed}", f"checkpoint.every_steps={every}",
                     f"checkpoint.keep={sweep.eval.points + 2}", f"checkpoint.keep_period={every}",
                     "log.progress=never")
            evaluate = (python, "-m", "seqmodels.sweeps.evaluate", "--run", str(run_dir),
                        "--settings", json.dumps(dataclasses.asdict(sweep.eval), sort_keys=True),
                        "--out", str(run_dir / "sweep_eval.json"))
            specs.append(RunSpec(variant, seed, run_dir, train, evaluate))
    return specs


def read_status(spec: RunSpec) -> dict | None:
    path = spec.run_dir / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_finished(spec: RunSpec) -> bool:
    """Done before, with the same training command (a changed budget or override runs again)."""
    status = read_status(spec)
    return bool(status) and status.get("status") == "done" and status.get("train_command") == list(spec.train_command)


def saved_steps(run_dir: Path) -> list[int]:
    """The checkpoint steps in ``run_dir`` (orbax writes one directory per step, named by the step)."""
    directory = run_dir / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def single_thread_env() -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_FLAGS).strip()
    env["OPENBLAS_NUM_THREADS"] = "1"
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    errors = [line for line in text if line.startswith("error:")]
    return errors[-1] if errors else " | ".join(text[-lines:])


def run_process(command, log_path: Path, time_limit_s: float | None) -> tuple[int, bool]:
    """Run ``command`` with output to ``log_path``; SIGTERM it after ``time_limit_s``. Returns (status, limited)."""
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=single_thread_env())
        try:
            return process.wait(timeout=time_limit_s), False
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # train.py saves its last step, then exits 3
            try:
                return process.wait(timeout=STOP_GRACE_S), True
            except subprocess.TimeoutExpired:
                process.kill()
                return process.wait(), True
        except BaseException:
            process.send_signal(signal.SIGTERM)
            process.wait()
            raise


def _write_status(spec: RunSpec, status: dict) -> None:
    path = spec.run_dir / STATUS_FILE
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(status, indent=2))
    temporary.replace(path)


def execute(spec: RunSpec, time_limit_minutes: float = 0.0) -> dict:
    """Train and evaluate one run (module docstring); return (and record) its status."""
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    status = {"variant": spec.variant.name, "seed": spec.seed, "train_command": list(spec.train_command),
              "eval_command": list(spec.eval_command)}
    limit = time_limit_minutes * 60 if time_limit_minutes > 0 else None
    code, limited = run_process(spec.train_command, spec.run_dir / "train.log", limit)
    status["train_seconds"] = time.perf_counter() - start
    status["train_exit"] = code
    if limited and code != EXIT_PREEMPTED:  # still inside a step (or compiling) long after SIGTERM: killed
        status.update(status="time_limit", error=f"stopped by time_limit_minutes={time_limit_minutes:g}: no training "
                      f"step ended within {STOP_GRACE_S} s of SIGTERM, so it was killed without a checkpoint")
        _write_status(spec, status)
        return status
    if code == EXIT_PREEMPTED and limited:
        status["status"] = "time_limit"
        status["error"] = (f"stopped by time_limit_minutes={time_limit_minutes:g} before "
                           f"train.steps={spec.variant.steps}")
        if not saved_steps(spec.run_dir):
            status["error"] += " and before its first step ended (start-up, compilation and one step took longer)"
            _write_status(spec, status)
            return status
    elif code == EXIT_PREEMPTED:
        status.update(status="interrupted", error="stopped by a signal after saving a checkpoint; run the sweep again "
                                                  "to resume it")
        _write_status(spec, status)
        return status
    elif code != 0:
        status.update(status="failed", error=f"train.py exited {code}: {_tail(spec.run_dir / 'train.log')}")
        _write_status(spec, status)
        return status
    else:
        status["status"] = "done"
    # A time-limited run is evaluated at its last checkpoint only: its evaluation is as slow as its training.
    evaluate = spec.eval_command + (("--last-only",) if status["status"] == "time_limit" else ())
    (spec.run_dir / "sweep_eval.json").unlink(missing_ok=True)  # an earlier invocation's results are stale now
    code, eval_limited = run_process(evaluate, spec.run_dir / "eval.log", limit)
    status["eval_exit"] = code
    if eval_limited:
        status.update(status="time_limit", error=f"evaluation stopped by time_limit_minutes={time_limit_minutes:g} "
                                                 "(its forward passes are as slow as its training)")
    elif code != 0:
        status.update(status="failed", error=f"evaluation exited {code}: {_tail(spec.run_dir / 'eval.log')}")
    status["seconds"] = time.perf_counter() - start
    _write_status(spec, status)
    return status
