"""A trained run read back: its resolved config, and the parameters of a checkpoint as a model."""

from __future__ import annotations

from pathlib import Path

from flax import nnx

from seqmodels.config import Config
from seqmodels.config_io import config_from_dict, read_yaml, to_dict
from seqmodels.models import abstract_model
from seqmodels.runs.checkpoints import CheckpointError, RunCheckpoints

CONFIG_FILE = "config.yaml"


def is_run_directory(path) -> bool:
    """Whether ``path`` is a run directory (it holds the ``config.yaml`` train.py writes)."""
    return (Path(path) / CONFIG_FILE).is_file()


def read_run_config(run_dir) -> Config:
    """The resolved config of ``run_dir``; ``CheckpointError`` when it is not a run directory."""
    if not is_run_directory(run_dir):
        raise CheckpointError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE} (train.py writes one)")
    return config_from_dict(read_yaml(Path(run_dir) / CONFIG_FILE))


def load_run_params(run_dir, *, step: int | None = None, model_overrides: Config | None = None):
    """``(config, params, step)``: the config saved with ``run_dir``'s checkpoint at ``step`` (default: the
    latest) and its parameters (``nnx.to_pure_dict`` layout, on this process's first device).

    Raises ``CheckpointError`` when the run has no checkpoint, or when ``model_overrides`` (a config
    whose model section should match) describes another architecture than the checkpoint's.
    """
    config, _, params, step = _restore(run_dir, step, model_overrides)
    return config, params, step


def load_run(run_dir, *, step: int | None = None, model_overrides: Config | None = None):
    """``(config, model, step)`` for ``run_dir``'s checkpoint at ``step`` (default: the latest); see
    ``load_run_params`` for what is checked."""
    config, graphdef, params, step = _restore(run_dir, step, model_overrides)
    return config, nnx.merge(graphdef, params), step


def _restore(run_dir, step: int | None, model_overrides: Config | None):
    config = read_run_config(run_dir)
    if not (Path(run_dir) / "checkpoints").is_dir():
        raise CheckpointError(f"{run_dir} holds no checkpoints yet")
    checkpoints = RunCheckpoints(run_dir)
    try:
        steps = checkpoints.steps()
        if not steps:
            raise CheckpointError(f"{run_dir} holds no checkpoints yet")
        step = max(steps) if step is None else step
        if step not in steps:
            raise CheckpointError(f"{run_dir} has no checkpoint at step {step}; it has steps {steps}")
        saved = config_from_dict(checkpoints.read_config(step))
        checkpoints.check_architecture(step, to_dict(model_overrides or config)["model"])
        graphdef, abstract_state = abstract_model(saved.model)
        params = checkpoints.restore_params(step, nnx.to_pure_dict(abstract_state))
    finally:
        checkpoints.close()
    return saved, graphdef, params, step
