"""The checkpoints of a run directory, read: which steps exist, each step's saved config, its parameters.

Layout: ``run_dir/checkpoints/<step>/{params, opt_state, meta, data, config}``, one orbax item each
(``ITEMS``); ``params`` is its own item so evaluation and export restore the parameters alone.
``RunCheckpoints`` opens them read-only; training's ``Checkpointer`` opens the same manager for writing.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from seqmodels.config import ConfigError
from seqmodels.config_io import config_from_dict, to_dict

ITEMS = ("params", "opt_state", "meta", "data", "config")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, of another architecture or settings, or cannot be written."""


def saved_model_config(saved: dict) -> dict:
    """The ``model`` section of a checkpoint's config dict, keys added since then filled with their defaults."""
    return to_dict(config_from_dict(saved))["model"]


def architecture_differences(saved: dict, current: dict, prefix: str = "model") -> list[str]:
    """Dotted keys whose values differ between two ``model`` config dicts."""
    keys = sorted(set(saved) | set(current))
    diffs = []
    for key in keys:
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += architecture_differences(a, b, f"{prefix}.{key}")
        elif a != b:
            diffs.append(f"{prefix}.{key}: checkpoint has {a!r}, config has {b!r}")
    return diffs


def read_only_options() -> ocp.CheckpointManagerOptions:
    """Manager options that never write to the run (no directory created, no rotation, no async saves)."""
    return ocp.CheckpointManagerOptions(create=False, read_only=True, enable_async_checkpointing=False)


class RunCheckpoints:
    """The orbax ``CheckpointManager`` of ``run_dir/checkpoints``; with the default ``options`` it never writes."""

    def __init__(self, run_dir, options: ocp.CheckpointManagerOptions | None = None):
        self.directory = Path(run_dir).absolute() / "checkpoints"
        self.created_directory = not self.directory.exists()
        self.manager = ocp.CheckpointManager(self.directory, options=options or read_only_options())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def steps(self) -> list[int]:
        """Every step saved, in increasing order."""
        return sorted(self.manager.all_steps())

    def read_config(self, step: int) -> dict:
        """The config dict saved with ``step`` (the run's resolved config at that step)."""
        return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config

    def check_architecture(self, step: int, model_config_dict: dict) -> None:
        """Raise ``CheckpointError`` listing every model key where the checkpoint differs.

        Keys added to the config after the checkpoint was written take their defaults (which, by the
        rule for adding a config key, reproduce the architecture as it was before the key existed).
        """
        try:
            saved = saved_model_config(self.read_config(step))
        except ConfigError as error:
            raise CheckpointError(f"the checkpoint at step {step} in {self.directory} holds a config this "
                                  f"version cannot read: {error}") from None
        diffs = architecture_differences(saved, model_config_dict)
        if diffs:
            raise CheckpointError(
                f"the checkpoint at step {step} in {self.directory} belongs to another architecture: "
                + "; ".join(diffs) + ". Use another train.run_dir, or the model config it was trained with.")

    def restore_params(self, step: int, abstract_params):
        """The parameters alone, on this process's first device whatever mesh saved them: a run trained on
        many devices loads for evaluation or export on one (orbax would otherwise ask for the saving devices)."""
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_params)
        args = ocp.args.Composite(params=ocp.args.StandardRestore(target))
        return self.manager.restore(step, args=args).params

    def close(self) -> None:
        self.manager.close()
