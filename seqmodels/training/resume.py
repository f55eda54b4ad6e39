"""Resuming a run: which checkpoint to restore, and which setting changes a resume refuses.

A resume continues the run that wrote the checkpoint, so it must reproduce it: the architecture
(``model.*``) may never differ, and every other setting that shapes the trajectory (data, optimizer,
schedule length, batch, seeds, mesh) must equal the checkpoint's unless the user names it in
``checkpoint.allow_changes``. Settings that only say where and how a run is stored or reported
(``RESUMABLE_KEYS``) may change freely.

The checkpoint restored is the newest *complete* one (``seqmodels.runs.checkpoint_check``): an
incomplete newer step is reported, and renamed aside only once an older one has been restored, so a
failed resume leaves the directory as it was.
"""

from __future__ import annotations

from seqmodels.config import Config, ConfigError
from seqmodels.config_io import all_keys, config_from_dict, to_dict
from seqmodels.optim.schedules import learning_rate_schedule
from seqmodels.runs.checkpoint_check import newest_complete
from seqmodels.runs.checkpoints import CheckpointError

# Keys (or sections, ending in '.') a resume may change without being asked: where the run lives, where its
# compiled programs are cached, when this process stops, how the collapse guard watches, how checkpoints are
# kept, how metrics are shown and the topology it runs on.
# The mesh too: the global batches do not depend on it, and the state is restored onto the new one.
RESUMABLE_KEYS = ("train.run_dir", "train.compilation_cache", "train.exit_at_step", "train.guard_steps",
                  "train.guard_sigma", "checkpoint.", "log.", "mesh.")


def check_allow_changes(allowed: tuple[str, ...]) -> None:
    """Each entry of ``checkpoint.allow_changes`` is a config key or section outside ``model``."""
    keys = set(all_keys())
    for key in allowed:
        if key not in keys:
            raise ConfigError(f"checkpoint.allow_changes: {key!r} is not a config key (python train.py --help-config "
                              "lists them)")
        if key == "model" or key.startswith("model."):
            raise ConfigError(f"checkpoint.allow_changes: {key!r} is part of the architecture, which a resume never "
                              "changes; use another train.run_dir")


def _flat(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _covered(key: str, names) -> bool:
    return any(key == name or key.startswith(name if name.endswith(".") else name + ".") for name in names)


def setting_differences(saved: Config, current: Config) -> dict[str, tuple]:
    """``{key: (checkpoint's value, config's value)}`` for non-architecture keys a resume must not change silently."""
    old, new = _flat(to_dict(saved)), _flat(to_dict(current))
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new))
            if not key.startswith("model.") and not _covered(key, RESUMABLE_KEYS) and old.get(key) != new.get(key)}


def schedule_note(saved: Config, current: Config, step: int) -> str | None:
    """What a changed ``train.steps`` (or optimizer schedule) does to the learning rate after ``step``.

    Step ``s`` (counted from 1, as logged) applies the schedule's value at ``s - 1`` (the number of updates
    made before it), so the first resumed step, ``step + 1``, uses ``schedule(step)``.
    """
    before = learning_rate_schedule(saved.optim, saved.train.steps)
    after = learning_rate_schedule(current.optim, current.train.steps)
    lr_before, lr_after = float(before(step)), float(after(step))
    if saved.train.steps == current.train.steps and lr_before == lr_after:
        return None
    return (f"train.steps {saved.train.steps} -> {current.train.steps}: the learning-rate schedule is rebuilt for "
            f"{current.train.steps} steps ({current.optim.schedule} after {current.optim.warmup_steps} warm-up "
            f"steps), so at step {step + 1} the learning rate is {lr_after:.4g} where the checkpoint's "
            f"schedule had {lr_before:.4g}")


def check_setting_changes(saved: Config, current: Config, step: int, where: str) -> list[str]:
    """Raise ``CheckpointError`` listing changed settings not named in ``checkpoint.allow_changes``;
    return the notes to print about the allowed ones."""
    diffs = setting_differences(saved, current)
    allowed = current.checkpoint.allow_changes
    refused = {key: values for key, values in diffs.items() if not _covered(key, allowed)}
    if refused:
        listed = "; ".join(f"{key}: checkpoint has {a!r}, config has {b!r}" for key, (a, b) in refused.items())
        note = schedule_note(saved, current, step) if "train.steps" in refused else None
        raise CheckpointError(
            f"resuming from step {step} in {where} would change settings the checkpoint was trained with: {listed}"
            + (f" ({note})" if note else "") + ". A resume must reproduce the run: use the checkpoint's settings, "
            f"another train.run_dir, or name the keys to change in checkpoint.allow_changes=[{', '.join(refused)}]")
    notes = ["resuming with changed settings (checkpoint.allow_changes): "
             + "; ".join(f"{key} {a!r} -> {b!r}" for key, (a, b) in diffs.items())] if diffs else []
    note = schedule_note(saved, current, step)
    return notes + ([note] if note else [])


def choose_step(checkpointer, config: Config, incomplete: dict[int, str], *, process_count: int):
    """``(step, saved_config)`` of the newest step not in ``incomplete`` that looks complete, or None.

    Steps found incomplete are added to ``incomplete`` with the reason (``checkpoint_check.newest_complete``,
    the choice every tool makes). The chosen step's config must describe the same architecture and
    settings as ``config`` (else ``CheckpointError``).
    """
    step = newest_complete(checkpointer.directory, checkpointer.manager.all_steps(), incomplete,
                           process_count=process_count)
    if step is None:
        return None
    checkpointer.check_architecture(step, to_dict(config)["model"])
    return step, config_from_dict(checkpointer.read_config(step))
