"""orbax checkpoints written: the train state, the data-iterator state and the resolved config of each step.

Layout (``seqmodels.runs.checkpoints``, which reads it): ``run_dir/checkpoints/<step>/{params, opt_state,
meta, data, config}``. Saves are atomic (orbax writes to a temporary directory and renames) and, when
``checkpoint.async_save``, run in the background; old steps rotate out by ``checkpoint.keep`` /
``keep_period``. A resume restores the whole train state and the data iterator in place.
"""

from __future__ import annotations

import contextlib

import grain
import jax
import orbax.checkpoint as ocp

from seqmodels.config import CheckpointConfig
from seqmodels.runs.checkpoints import CheckpointError, RunCheckpoints, read_only_options
from seqmodels.runs.checkpoint_check import set_aside


class Checkpointer(RunCheckpoints):
    """The run's orbax ``CheckpointManager`` for writing; ``read_only=True`` opens it as ``RunCheckpoints`` does."""

    def __init__(self, run_dir, config: CheckpointConfig, *, read_only: bool = False):
        options = read_only_options() if read_only else ocp.CheckpointManagerOptions(
            max_to_keep=config.keep, keep_period=config.keep_period or None, create=True,
            enable_async_checkpointing=config.async_save)
        super().__init__(run_dir, options)
        self.last_saved: int | None = None

    def save(self, step: int, state: dict, data_iterator, config_dict: dict) -> None:
        items = dict(params=ocp.args.StandardSave(state["params"]),
                     opt_state=ocp.args.StandardSave(state["opt_state"]),
                     meta=ocp.args.JsonSave({"step": int(step)}),
                     config=ocp.args.JsonSave(config_dict))
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        with self._save_errors(step):
            self.manager.save(step, args=ocp.args.Composite(**items), force=True)
        self.last_saved = step

    @contextlib.contextmanager
    def _save_errors(self, step: int | None):
        """A failed write (full disk, read-only file system, ...) as a ``CheckpointError`` saying what is kept.

        orbax writes a step into a temporary directory and renames it when complete, so the steps already
        committed are untouched by a failed save; the temporary directory is left for orbax to clean up.
        """
        try:
            yield
        except (OSError, ValueError, RuntimeError) as error:
            committed = sorted(self.manager.all_steps(read=True)) if self.directory.is_dir() else []
            failed = [s for s in committed if s != step] if step is not None else committed
            kept = f"the checkpoint at step {failed[-1]} is kept" if failed else "no earlier checkpoint exists"
            what = f"the checkpoint at step {step}" if step is not None else "a checkpoint"
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CheckpointError(f"writing {what} to {self.directory} failed: {reason[:300]}; {kept}. Free disk "
                                  "space (or fix the directory's permissions) and run the same command to "
                                  "resume") from None

    def check_process_count(self, step: int) -> None:
        """Raise ``CheckpointError`` unless the checkpoint's data position was saved by as many processes
        as run now: each process saved the position of its own share of the data, which another split
        of the data cannot continue."""
        files = sorted((self.directory / str(step) / "data").glob("process_*-of-*.json"))
        saved = {int(f.stem.rsplit("-of-", 1)[1]) for f in files}
        if saved and saved != {jax.process_count()}:
            raise CheckpointError(
                f"the checkpoint at step {step} in {self.directory} was written by {min(saved)} process(es) and "
                f"this run has {jax.process_count()}: the data position of each process cannot be carried over "
                f"to another number of processes. Resume with {min(saved)} process(es), or start a new "
                "train.run_dir (its parameters can be loaded for evaluation on any number of devices).")

    def restore(self, step: int, abstract_state: dict, data_iterator) -> dict:
        """Restore the train state (into ``abstract_state``'s shardings) and the data iterator in place."""
        items = dict(params=ocp.args.StandardRestore(_abstract(abstract_state["params"])),
                     opt_state=ocp.args.StandardRestore(_abstract(abstract_state["opt_state"])),
                     meta=ocp.args.JsonRestore())
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        step_array = jax.device_put(jax.numpy.asarray(restored.meta["step"], jax.numpy.int32),
                                    abstract_state["step"].sharding)
        return {"step": step_array, "params": restored.params, "opt_state": restored.opt_state}

    def set_aside(self, incomplete: dict[int, str], message) -> None:
        """Rename incomplete steps aside (``checkpoint_check.set_aside``) and forget them."""
        for step, problems in sorted(incomplete.items()):
            if jax.process_index() == 0 and (self.directory / str(step)).is_dir():
                target = set_aside(self.directory / str(step))
                message(f"warning: the checkpoint at step {step} is incomplete ({problems}); renamed aside to "
                        f"{target}")
        self.manager.reload()

    def wait(self) -> None:
        with self._save_errors(self.last_saved):
            self.manager.wait_until_finished()

    def close(self) -> None:
        try:
            with self._save_errors(self.last_saved):
                self.manager.wait_until_finished()
        finally:
            self.manager.close()
            if self.created_directory and self.directory.is_dir() and not any(self.directory.iterdir()):
                self.directory.rmdir()  # nothing was saved: leave the run directory as it was


def _abstract(tree):
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
