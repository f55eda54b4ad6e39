"""Load a trained run: its resolved config and the parameters of a checkpoint, as a model."""

from __future__ import annotations

from pathlib import Path

from flax import nnx

from seqmodels.config import Config
from seqmodels.config_io import config_from_dict, read_yaml, to_dict
from seqmodels.training.checkpoint import Checkpointer, CheckpointError
from seqmodels.training.state import abstract_model


def load_run(run_dir, *, step: int | None = None, model_overrides: Config | None = None):
    """``(config, model, step)`` for ``run_dir``'s checkpoint at ``step`` (default: the latest).

    Raises ``CheckpointError`` when the run has no checkpoint, or when ``model_overrides`` (a config
    whose model section should match) describes another architecture than the checkpoint's.
    """
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise CheckpointError(f"{run_dir} is not a run directory: it has no config.yaml (train.py writes one)")
    config = config_from_dict(read_yaml(config_path))
    if not (run_dir / "checkpoints").is_dir():
        raise CheckpointError(f"{run_dir} holds no checkpoints yet")
    checkpointer = Checkpointer(run_dir, config.checkpoint, read_only=True)
    try:
        steps = checkpointer.manager.all_steps()
        if not steps:
            raise CheckpointError(f"{run_dir} holds no checkpoints yet")
        step = max(steps) if step is None else step
        if step not in steps:
            raise CheckpointError(f"{run_dir} has no checkpoint at step {step}; it has steps {sorted(steps)}")
        saved = config_from_dict(checkpointer.read_config(step))
        wanted = model_overrides or config
        checkpointer.check_architecture(step, to_dict(wanted)["model"])
        graphdef, abstract_state = abstract_model(saved.model)
        params = checkpointer.restore_params(step, nnx.to_pure_dict(abstract_state))
    finally:
        checkpointer.close()
    return saved, nnx.merge(graphdef, params), step
