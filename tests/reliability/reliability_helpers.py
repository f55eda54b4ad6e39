"""Shared by the fault-injection tests: train.py in a subprocess of this worktree, snapshots, final params."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def subprocess_env(devices: int = 1) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


def run_script(script: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def start_train(overrides) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def truncate(path: Path) -> None:
    """``path`` cut to half its bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def truncate_data_files(directory: Path) -> None:
    """Every data file of an OCDBT store (``<item>/ocdbt.process_0/d``) cut to half. Not only the largest: in one
    run of the suite the largest held nothing the restore read (the store keeps superseded writes; the run
    resumed from that step without a warning and ended on the uninterrupted run's loss)."""
    files = [p for p in Path(directory).rglob("*") if p.is_file()]
    assert files, f"no data files under {directory}"
    for path in files:
        truncate(path)


def snapshot(directory) -> dict:
    """Every path under ``directory`` with its modification time and size: equal snapshots = nothing written."""
    return {p.relative_to(directory): (p.stat().st_mtime_ns, p.stat().st_size) for p in Path(directory).rglob("*")}


def logged_steps(run_dir) -> list[int]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def logged_losses(run_dir) -> dict[int, float]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


def final_params(run_dir, step=None):
    from flax import nnx

    from seqmodels.runs.load import load_run
    _, model, step = load_run(run_dir, step=step)
    return step, nnx.to_pure_dict(nnx.state(model, nnx.Param))


def assert_same_params(a, b) -> None:
    import jax
    import numpy as np
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise: no tolerance


def one_paragraph_error(stderr: str, *fragments) -> None:
    err = stderr.strip()
    assert err.startswith("error: "), err[-2000:]
    assert "\n" not in err and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in err, err
