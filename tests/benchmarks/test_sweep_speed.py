"""benchmarks/sweep_speed.py: every variant of a sweep trained a few steps, one at a time, tokens/s tabled."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_ablate import ROOT, one_device_env, tiny_sweep


@pytest.mark.slow
def test_every_variant_gets_a_steady_rate_and_a_ratio_to_the_first(tmp_path):
    out = tmp_path / "speed.md"
    result = subprocess.run([sys.executable, "benchmarks/sweep_speed.py", "--sweep", str(tiny_sweep(tmp_path)),
                             "--steps", "3", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, env=one_device_env())
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0].strip() for r in rows] == ["transformer", "swa"]
    speeds = [float(r[1]) for r in rows]
    assert all(s > 0 for s in speeds) and float(rows[0][2]) == 1.0
    assert float(rows[1][2]) == pytest.approx(speeds[1] / speeds[0], abs=0.01)
    assert [int(r[3]) for r in rows] == [3, 3]  # three steps logged, the first left out of the rate


def test_too_few_steps_is_a_usage_error():
    result = subprocess.run([sys.executable, "benchmarks/sweep_speed.py", "--sweep", "configs/sweeps/memory.yaml",
                             "--steps", "2", "--out", "/dev/null"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "--steps must be >= 3" in result.stderr
