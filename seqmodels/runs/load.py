"""A trained run read back: its resolved config, and the parameters of a checkpoint as a model."""

from __future__ import annotations

import sys
from pathlib import Path

from flax import nnx

from seqmodels.config import Config, ConfigError
from seqmodels.config_io import config_from_dict, read_yaml, to_dict
from seqmodels.models import abstract_model
from seqmodels.runs.checkpoint_check import describe_incomplete, newest_complete, restore_with_fallback
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


def load_run_params(run_dir, *, step: int | None = None, model_overrides: Config | None = None, warn=None):
    """``(config, params, step)``: the config saved with ``run_dir``'s checkpoint at ``step`` (default: the
    newest complete one, as training resumes) and its parameters (``nnx.to_pure_dict`` layout, on this
    process's first device).

    Damaged newer steps are skipped, each named by ``warn(message)`` (default: a ``warning:`` line on
    stderr); the run directory is never written. Raises ``CheckpointError`` when the run has no
    checkpoint, the ``step`` asked for is missing or damaged, no step can be read, or ``model_overrides``
    (a config whose model section should match) describes another architecture than the checkpoint's.
    """
    config, _, params, step = _restore(run_dir, step, model_overrides, warn or _warn)
    return config, params, step


def load_run(run_dir, *, step: int | None = None, model_overrides: Config | None = None, warn=None):
    """``(config, model, step)`` for ``run_dir``'s checkpoint at ``step`` (default: the newest complete one);
    see ``load_run_params`` for what is checked."""
    config, graphdef, params, step = _restore(run_dir, step, model_overrides, warn or _warn)
    return config, nnx.merge(graphdef, params), step


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


def _restore(run_dir, step: int | None, model_overrides: Config | None, warn):
    config = read_run_config(run_dir)
    if not (Path(run_dir) / "checkpoints").is_dir():
        raise CheckpointError(f"{run_dir} holds no checkpoints yet")
    checkpoints = RunCheckpoints(run_dir)
    incomplete: dict[int, str] = {}
    try:
        steps = checkpoints.steps()
        if not steps:
            raise CheckpointError(f"{run_dir} holds no checkpoints yet")
        if step is not None and step not in steps:
            raise CheckpointError(f"{run_dir} has no checkpoint at step {step}; it has steps {steps}")

        def choose() -> int | None:
            checkpoints.manager.reload()  # a live run may have saved or rotated steps since
            return newest_complete(checkpoints.directory, checkpoints.steps(), incomplete, step=step,
                                   process_count=None)

        def restore(chosen: int):
            saved = config_from_dict(checkpoints.read_config(chosen))
            checkpoints.check_architecture(chosen, to_dict(model_overrides or config)["model"])
            graphdef, abstract_state = abstract_model(saved.model)
            return saved, graphdef, checkpoints.restore_params(chosen, nnx.to_pure_dict(abstract_state))

        restored = restore_with_fallback(choose, restore, incomplete, refusals=(CheckpointError, ConfigError))
    finally:
        checkpoints.close()
    if restored is None and step is not None:
        raise CheckpointError(f"the checkpoint at step {step} in {checkpoints.directory} cannot be used: "
                              f"{incomplete[step]}; choose another --step (the run has steps {steps}) or leave it "
                              "out for the newest complete one")
    if restored is None:
        raise CheckpointError(f"no checkpoint in {checkpoints.directory} can be read: "
                              f"{describe_incomplete(incomplete)}")
    chosen, (saved, graphdef, params) = restored
    for skipped, problems in sorted(incomplete.items()):
        warn(f"warning: skipped the checkpoint at step {skipped} in {checkpoints.directory}: {problems}; "
             f"using step {chosen}")
    return saved, graphdef, params, chosen
