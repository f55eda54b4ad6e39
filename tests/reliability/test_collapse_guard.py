"""The collapse guard stops a run whose finite loss went bad before its state rotates good checkpoints out."""

import pytest

import train as train_entry
from conftest import tiny_overrides
from seqmodels.config_io import load_config
from seqmodels.training.checkpoint import Checkpointer
from seqmodels.training.guard import WARMUP, CollapseGuard


def test_zero_gradient_norm_steps_trip_the_guard_after_k_in_a_row():
    guard = CollapseGuard(steps=3, sigma=6.0)
    guard.observe(1, 5.0, 1.0)
    guard.observe(2, 5.7, 0.0)
    assert guard.suspicious and not guard.tripped
    guard.observe(3, 4.9, 0.5)  # a healthy step ends the streak
    assert not guard.suspicious
    for step in (4, 5, 6):
        guard.observe(step, 5.7, 0.0)
    assert guard.tripped and "step 4: gradient norm 0" in guard.streak[0]


def test_loss_spike_is_measured_against_running_statistics_of_healthy_steps():
    guard = CollapseGuard(steps=2, sigma=6.0)
    for step in range(WARMUP):
        guard.observe(step, 3.0 + 0.01 * (step % 2), 1.0)
    assert guard.anomaly(3.02, 1.0) is None  # within the noise
    assert "std above its running mean" in guard.anomaly(6.0, 1.0)
    guard.observe(20, 6.0, 1.0)
    guard.observe(21, 6.0, 1.0)  # spikes do not enter the statistics, so the second is a spike too
    assert guard.tripped


def test_guard_off_never_trips():
    guard = CollapseGuard(steps=0, sigma=6.0)
    for step in range(20):
        guard.observe(step, 5.0, 0.0)
    assert not guard.suspicious and not guard.tripped


def test_collapsed_run_stops_with_status_1_and_keeps_healthy_checkpoints(tmp_path, tiny_corpus, capsys):
    """optim.learning_rate=30 on the tiny model: the loss sticks at ln(320) with gradient norm 0 (measured)."""
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, tiny_corpus, train__steps=60, optim__learning_rate=30,
                               optim__warmup_steps=0, checkpoint__every_steps=2)
    assert train_entry.main(overrides) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: collapse guard (train.guard_steps=4") and "\n" not in err
    assert "gradient norm 0" in err and "a lower optim.grad_clip (now 1.0)" in err
    checkpointer = Checkpointer(run_dir, load_config(None, overrides).checkpoint, read_only=True)
    kept = checkpointer.manager.all_steps()
    checkpointer.close()
    collapsed = int(err.split("anomalous steps in a row (step ")[1].split(":")[0])
    assert kept and max(kept) < collapsed  # no checkpoint holds a state of the anomalous steps


@pytest.mark.slow
def test_keep_period_steps_are_never_rotated_out(tmp_path, tiny_corpus):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, tiny_corpus, train__steps=20, checkpoint__every_steps=2,
                               checkpoint__keep=2, checkpoint__keep_period=6)
    assert train_entry.main(overrides) == 0
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [6, 12, 18, 20]
