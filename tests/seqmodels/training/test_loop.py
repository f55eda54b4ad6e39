"""The training loop end to end: resume after a process exit, divergence, accumulation, metrics."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import tiny_overrides
from seqmodels.config_io import load_config
from seqmodels.runs.load import load_run
from seqmodels.training.loop import TrainingDiverged, train

ROOT = Path(__file__).resolve().parents[3]


def run_train_process(overrides, devices=1):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def logged_losses(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


def final_params(run_dir):
    _, model, step = load_run(run_dir)
    from flax import nnx
    return step, nnx.to_pure_dict(nnx.state(model, nnx.Param))


@pytest.mark.slow
def test_resume_after_process_exit_reproduces_the_uninterrupted_run_bitwise(tmp_path, tiny_corpus):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_train_process(tiny_overrides(straight, tiny_corpus, checkpoint__async_save=True))
    # keep=3 of the checkpoints at steps 5, 10, 15, 20
    assert sorted(int(p.name) for p in (straight / "checkpoints").iterdir() if p.name.isdigit()) == [10, 15, 20]
    first = run_train_process(tiny_overrides(resumed, tiny_corpus, train__exit_at_step=10, checkpoint__async_save=True))
    assert "done: steps 1..10" in first.stdout
    second = run_train_process(tiny_overrides(resumed, tiny_corpus, checkpoint__async_save=True))
    assert "done: steps 11..20" in second.stdout
    straight_losses, resumed_losses = logged_losses(straight), logged_losses(resumed)
    assert sorted(straight_losses) == sorted(resumed_losses) == list(range(1, 21))
    assert straight_losses == resumed_losses  # exact equality, every step
    step_a, params_a = final_params(straight)
    step_b, params_b = final_params(resumed)
    assert step_a == step_b == 20
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)


LOAD_ON_ONE_DEVICE = """
import sys
import jax, numpy as np
from flax import nnx
from seqmodels.runs.load import load_run
_, model, step = load_run(sys.argv[1])
leaves = jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
np.savez(sys.argv[2], step=step, devices=jax.device_count(), *[np.asarray(leaf) for leaf in leaves])
"""


@pytest.mark.slow
def test_a_run_trained_on_two_devices_loads_for_evaluation_on_one(tmp_path, tiny_corpus):
    run_dir = tmp_path / "two_devices"
    run = run_train_process(tiny_overrides(run_dir, tiny_corpus, train__steps=5), devices=2)
    assert "mesh {'data': 2" in run.stdout + run.stderr
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    loaded = subprocess.run([sys.executable, "-c", LOAD_ON_ONE_DEVICE, str(run_dir), str(tmp_path / "one.npz")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    one = np.load(tmp_path / "one.npz")
    assert int(one["step"]) == 5 and int(one["devices"]) == 1
    step, params = final_params(run_dir)  # this process has 8 devices, the two that saved among them
    leaves = jax.tree.leaves(params)
    assert step == 5 and len(leaves) == len(one.files) - 2
    for index, leaf in enumerate(leaves):
        np.testing.assert_array_equal(np.asarray(leaf), one[f"arr_{index}"])


def test_loss_falls_and_metrics_are_written(tmp_path, tiny_corpus):
    summary = train(load_config(None, tiny_overrides(tmp_path / "run", tiny_corpus, train__steps=15)))
    assert summary["last_loss"] < summary["first_loss"] - 0.5
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 16))
    for key in ("loss", "learning_rate", "grad_norm", "tokens_per_second", "step_time", "mfu"):
        assert all(np.isfinite(r[key]) for r in records), key
    assert 0 < records[-1]["mfu"] < 1
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    assert load_config(tmp_path / "run" / "config.yaml") == load_config(
        None, tiny_overrides(tmp_path / "run", tiny_corpus, train__steps=15))


@pytest.mark.slow
def test_gradient_accumulation_gives_the_same_update(tmp_path, tiny_corpus):
    params = {}
    for accum in (1, 4):
        run_dir = tmp_path / f"accum{accum}"
        train(load_config(None, tiny_overrides(run_dir, tiny_corpus, train__steps=2, train__batch_size=32,
                                                         train__grad_accum=accum)))
        params[accum] = final_params(run_dir)[1]
    # Same batch, same summed-loss gradient; only float summation order differs.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6), params[1], params[4])


def test_nonfinite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, tiny_corpus):
    run_dir = tmp_path / "diverge"
    config = load_config(None, tiny_overrides(run_dir, tiny_corpus, train__steps=40, optim__learning_rate=1e30,
                                              optim__grad_clip=0.0, optim__warmup_steps=0,
                                              checkpoint__every_steps=1))
    with pytest.raises(TrainingDiverged, match=r"training diverged and stopped. The last good checkpoint is kept"):
        train(config)
    from seqmodels.training.checkpoint import Checkpointer
    checkpointer = Checkpointer(run_dir, config.checkpoint)
    latest = checkpointer.latest_step()
    checkpointer.close()
    assert latest is not None and latest < 40
    _, model, _ = load_run(run_dir)
    from flax import nnx
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.slow
def test_a_tiny_lm_trains_with_muon_and_muon_moves_only_projections(tmp_path, tiny_corpus):
    from flax import nnx

    from seqmodels.optim.build import build_optimizer
    from seqmodels.sharding import param_logical_axes
    from seqmodels.models import abstract_model

    config = load_config(None, tiny_overrides(tmp_path / "muon", tiny_corpus, optim__name="muon",
                                              train__steps=15, optim__learning_rate=0.02, optim__muon_per_head=True))
    summary = train(config)
    assert summary["last_loss"] < summary["first_loss"] - 0.5
    # The Muon group's updates are orthogonalised: equal singular values on a projection matrix.
    _, state = abstract_model(config.model)
    axes = param_logical_axes(state)
    params = jax.tree.map(lambda s: jax.numpy.asarray(np.random.default_rng(0).normal(size=s.shape), np.float32),
                          nnx.to_pure_dict(state))
    from dataclasses import replace
    no_decay = replace(config.optim, weight_decay=0.0, warmup_steps=0)  # the update is then -lr * 0.2 sqrt(n) O
    optimizer, _ = build_optimizer(no_decay, 10, param_axes=axes,
                                   param_shapes=jax.tree.map(lambda x: x.shape, params))
    grads = jax.tree.map(lambda p: p[::-1] * 0.5, params)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    lr = config.optim.learning_rate

    def assert_in_band(matrix):
        # 5 NS steps with the muon coefficients map singular values into [0.68, 1.14]; NS runs on
        # bf16 operands here, whose rounding moves them by up to ~1.5%: [0.67, 1.15].
        scale = lr * 0.2 * np.sqrt(max(matrix.shape))
        singular = np.linalg.svd(matrix, compute_uv=False) / scale
        assert 0.67 <= singular.min() and singular.max() <= 1.15, singular

    assert_in_band(np.asarray(updates["blocks"][0]["mlp"]["down"]["kernel"]))  # [mlp, embed]
    query = np.asarray(updates["blocks"][0]["mixer"]["query"]["kernel"])  # [embed, heads, head_dim]
    for head in range(query.shape[1]):  # per head: each head's [embed, head_dim] block
        assert_in_band(query[:, head])
    # AdamW group: the first update is -lr * g / (|g| + eps) elementwise: lr in size, except where the
    # clipped gradient is within a few orders of eps=1e-8 (a few elements, up to 2% smaller).
    np.testing.assert_allclose(np.abs(np.asarray(updates["embed"])), lr, rtol=2e-2)


@pytest.mark.slow
def test_sigterm_checkpoints_the_current_step_and_exits_with_the_preempted_status(tmp_path, tiny_corpus):
    import signal
    import time
    run_dir = tmp_path / "sigterm"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    overrides = tiny_overrides(run_dir, tiny_corpus, train__steps=100000, checkpoint__every_steps=100000)
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *overrides], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 3, stderr[-2000:]  # train.EXIT_PREEMPTED: a scheduler tells it from completion
    assert "SIGTERM received: checkpoint saved at step" in stdout
    saved = int(stdout.split("checkpoint saved at step ")[1].split(";")[0])
    assert saved >= 3
    step, _ = final_params(run_dir)
    assert step == saved
