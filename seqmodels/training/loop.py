"""The training loop: validate -> mesh -> sharded state -> (resume) -> steps -> checkpoints and metrics.

Everything that can be wrong with the input (config, data source, vocabulary, batch layout, a run
directory owned by another run, an existing checkpoint of another architecture or other settings)
is checked before anything is written; a resume restores the newest complete checkpoint
(``seqmodels.training.resume``) before the first write, and a fresh start of a model whose kind starts
from a checkpoint takes that checkpoint's weights (``seqmodels.hf.base.start_params``). The model is
known only through its kind (``seqmodels.models``: build, FLOPs, which parameters train).
Metrics of step s are read back after step s + 1 is dispatched, so the host never stalls the
device except at checkpoints, where the step's loss is checked before its state is saved: a
checkpoint never holds a state reached through a non-finite loss.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import jax
from flax import nnx

from seqmodels.compilation import CompileRecord, use_compilation_cache
from seqmodels.config import Config, ConfigError
from seqmodels.config_io import save_config, to_dict
from seqmodels.data.pipeline import describe_source, make_train_dataset, required_vocab_size
from seqmodels.hf.base import start_params
from seqmodels.mixers import check_context_parallel, check_mixer_names, context_parallel_notes
from seqmodels.models import abstract_model, check_context_parallel_kind, flops_per_token, trainable_filter
from seqmodels.models.trainable import trainable_part
from seqmodels.optim.build import build_optimizer
from seqmodels.runs.checkpoint_check import describe_incomplete, restore_with_fallback
from seqmodels.runs.checkpoints import CheckpointError
from seqmodels.sharding import batch_sharding as sequence_batch_sharding, make_mesh, param_logical_axes
from seqmodels.training.agreed_stop import AgreedStop
from seqmodels.training.batches import ProcessRows, data_shard, global_batch
from seqmodels.training.checkpoint import Checkpointer
from seqmodels.training.flops import mfu, peak_flops_per_device
from seqmodels.training.guard import CollapseGuard
from seqmodels.training.metrics import MetricsLogger
from seqmodels.training.resume import check_allow_changes, check_setting_changes, choose_step
from seqmodels.training.run_dir import RunDirLock
from seqmodels.training.state import count_params, init_train_state
from seqmodels.training.step import make_train_step
from seqmodels.training.stop import StopFlag


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN or infinite."""


def validate(config: Config, mesh) -> None:
    """Checks that need more than one config section; raise ``ConfigError``."""
    check_mixer_names(config.model.mixers)
    check_context_parallel_kind(config.model, mesh.shape["context"])
    check_context_parallel(config.model.mixers, mesh.shape["context"])
    check_allow_changes(config.checkpoint.allow_changes)
    vocab = required_vocab_size(config.data)
    if config.model.vocab_size < vocab:
        raise ConfigError(f"model.vocab_size={config.model.vocab_size} is smaller than the vocabulary of "
                          f"data.source={config.data.source} ({vocab}); set model.vocab_size >= {vocab}")
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = config.train.batch_size // config.train.grad_accum
    if rows % data_parallel:
        raise ConfigError(f"train.batch_size={config.train.batch_size} / train.grad_accum={config.train.grad_accum} "
                          f"= {rows} rows per micro-batch must be divisible by mesh data x fsdp = {data_parallel}")
    context = mesh.shape["context"]
    if config.data.seq_len % context:
        raise ConfigError(f"data.seq_len={config.data.seq_len} must be divisible by mesh.context={context} (each "
                          "row's tokens are split into that many equal contiguous shards)")


def _open_checkpoints(config: Config) -> tuple[Checkpointer | None, tuple | None, dict[int, str]]:
    """The run's checkpointer, the ``(step, saved config)`` to resume from (None: start afresh) and the
    newer steps found incomplete; the chosen step is checked to fit the model and the settings."""
    incomplete: dict[int, str] = {}
    if not (Path(config.train.run_dir) / "checkpoints").is_dir():
        return None, None, incomplete
    checkpointer = Checkpointer(config.train.run_dir, config.checkpoint)
    try:
        return checkpointer, *_resume_choice(checkpointer, config, incomplete)
    except BaseException:
        checkpointer.close()
        raise


def _resume_choice(checkpointer: Checkpointer, config: Config, incomplete: dict[int, str]):
    if checkpointer.latest_step() is None:
        return None, incomplete
    if not config.checkpoint.resume:
        raise CheckpointError(f"{config.train.run_dir} already holds checkpoints (latest step "
                              f"{checkpointer.latest_step()}) and checkpoint.resume=false; choose a new "
                              "train.run_dir or set checkpoint.resume=true")
    choice = choose_step(checkpointer, config, incomplete, process_count=jax.process_count())
    if choice is None:
        raise CheckpointError(
            f"no complete checkpoint in {checkpointer.directory}: {describe_incomplete(incomplete)}"
            ". Nothing was changed; move the damaged steps away to train from scratch, or use another train.run_dir")
    check_setting_changes(choice[1], config, choice[0], str(checkpointer.directory))
    return choice, incomplete


def _restore_newest_complete(config: Config, checkpointer: Checkpointer, choice, incomplete: dict[int, str],
                             state: dict, iterator) -> tuple[dict, int, list[str]]:
    """Restore the chosen step, falling back step by step past any whose arrays cannot be read
    (``checkpoint_check.restore_with_fallback``, as evaluation and export restore).

    Returns ``(state, step, notes)``. Incomplete steps are renamed aside only after a restore
    succeeded; when none succeeds, nothing is renamed and ``CheckpointError`` lists every problem.
    """
    pending, saved_configs = [choice], {}

    def choose() -> int | None:
        chosen = pending.pop() if pending else choose_step(checkpointer, config, incomplete,
                                                           process_count=jax.process_count())
        if chosen is None:
            return None
        saved_configs[chosen[0]] = chosen[1]
        return chosen[0]

    restored = restore_with_fallback(choose, lambda step: checkpointer.restore(step, state, iterator), incomplete)
    if restored is None:
        raise CheckpointError(
            f"no checkpoint in {checkpointer.directory} could be restored: {describe_incomplete(incomplete)}. "
            "Nothing was changed; move the damaged steps away to train from scratch, or use another train.run_dir")
    step, restored_state = restored
    notes = check_setting_changes(saved_configs[step], config, step, str(checkpointer.directory))
    checkpointer.set_aside(incomplete, print)
    return restored_state, step, notes


def _make_mesh(config: Config):
    try:
        return make_mesh(config.mesh)
    except ValueError as error:
        raise ConfigError(f"{error}; set mesh.data, mesh.fsdp, mesh.context and mesh.tensor to multiply to the device count "
                          f"({jax.device_count()}), or one of them to -1") from None


def train(config: Config, stop: StopFlag | None = None) -> dict:
    """Run (or resume) training as configured; returns a summary with the first and last losses.

    Holds ``run_dir/run.lock`` throughout (``RunDirError`` if another live run holds it). Nothing in
    the run directory is written before the checkpoint to resume from (if any) has been restored.
    ``summary["interrupted_by"]`` names the signal that stopped the run early, else None.
    """
    own_stop, stop = stop is None, stop or StopFlag()  # a caller's flag stays the caller's to restore
    try:
        try:
            cache_dir = use_compilation_cache(config.train.compilation_cache)
        except ConfigError as error:
            raise ConfigError(f"train.compilation_cache: {error}") from None
        mesh = _make_mesh(config)
        validate(config, mesh)
        batch_sharding = sequence_batch_sharding(mesh)
        # every process draws the global batch and keeps its rows (processes holding the same rows: one shard)
        shard, shards = data_shard(batch_sharding, config.train.batch_size)
        dataset = make_train_dataset(config.data, batch_size=config.train.batch_size)
        iterator = iter(dataset.map(ProcessRows(shard, shards, config.train.batch_size)) if shards > 1 else dataset)
        # One lock per run, held by process 0: the processes of one multi-process run share the directory.
        with RunDirLock(config.train.run_dir) if jax.process_index() == 0 else contextlib.nullcontext():
            checkpointer, choice, incomplete = _open_checkpoints(config)
            checkpointer = checkpointer or Checkpointer(config.train.run_dir, config.checkpoint)
            try:
                with jax.set_mesh(mesh), CompileRecord(cache_dir) as compiles:
                    return _run(config, mesh, iterator, checkpointer, choice, incomplete, stop, batch_sharding,
                                compiles)
            finally:
                checkpointer.close()
    finally:
        if own_stop:
            stop.restore()


class _StepRecorder:
    """Checks each step's metrics for NaN/inf, keeps the losses, and logs every ``log.every_steps``."""

    def __init__(self, config: Config, logger: MetricsLogger, *, start: int, last_step: int, num_devices: int,
                 checkpoint_dir, compiles: CompileRecord):
        self.config, self.logger, self.last_step = config, logger, last_step
        self.compiles, self.compile_metrics = compiles, {}
        self.checkpoint_dir, self.last_saved = checkpoint_dir, start or None
        self.tokens_per_step = config.train.batch_size * config.data.seq_len
        self.flops_per_token = flops_per_token(config.model, config.data.seq_len)
        self.peak = peak_flops_per_device(config.log.peak_flops_per_device, config.model.compute_dtype)
        self.num_devices = num_devices
        self.losses: dict[int, float] = {}
        self.guard = CollapseGuard(config.train.guard_steps, config.train.guard_sigma)
        self.clock = (time.perf_counter(), start)

    def compiled(self) -> None:
        """Log what the first step's compiles cost and whether the persistent cache served them; the first
        metrics row written carries the same numbers (``compile_seconds``, ``cache_served``, ...)."""
        self.logger.message(self.compiles.describe())
        self.compile_metrics = self.compiles.as_metrics()

    def _kept(self) -> str:
        return f"step {self.last_saved} in {self.checkpoint_dir}" if self.last_saved else "none was saved yet"

    def _remedies(self) -> str:
        clip = self.config.optim.grad_clip
        clipping = (f"a lower optim.grad_clip (now {clip})" if clip > 0 else "optim.grad_clip > 0 (now off)")
        return (f"try a lower optim.learning_rate (now {self.config.optim.learning_rate}), a longer "
                f"optim.warmup_steps (now {self.config.optim.warmup_steps}) or {clipping}")

    def record(self, step: int, metrics) -> None:
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
            raise TrainingDiverged(
                f"loss={values['loss']} grad_norm={values['grad_norm']} at step {step}: training diverged and "
                f"stopped. The last good checkpoint is kept ({self._kept()}); {self._remedies()}.")
        self.guard.observe(step, values["loss"], values["grad_norm"])
        if self.guard.tripped:
            raise TrainingDiverged(
                f"collapse guard (train.guard_steps={self.config.train.guard_steps}, train.guard_sigma="
                f"{self.config.train.guard_sigma}): {len(self.guard.streak)} anomalous steps in a row "
                f"({'; '.join(self.guard.streak)}), none of them saved; training diverged and stopped. The last good "
                f"checkpoint is kept ({self._kept()}); {self._remedies()}.")
        self.losses[step] = values["loss"]
        if step % self.config.log.every_steps and step != self.last_step:
            return
        now, since = time.perf_counter(), self.clock
        tokens_per_second = self.tokens_per_step * (step - since[1]) / max(now - since[0], 1e-9)
        values.update(tokens_per_second=tokens_per_second,
                      step_time=(now - since[0]) / max(step - since[1], 1),
                      mfu=mfu(tokens_per_second, self.flops_per_token, self.peak, self.num_devices))
        values.update(self.compile_metrics)
        self.compile_metrics = {}
        self.clock = (now, step)
        self.logger.log(step, values)
        self.logger.advance(step, values["loss"], tokens_per_second)


def _run(config: Config, mesh, iterator, checkpointer: Checkpointer, choice, incomplete: dict[int, str],
         stop: StopFlag, batch_sharding, compiles: CompileRecord) -> dict:
    _, abstract_state = abstract_model(config.model, config.train.seed)
    trainable = trainable_filter(config.model)
    shapes = jax.tree.map(lambda x: tuple(x.shape), nnx.to_pure_dict(abstract_state))
    optimizer, schedule = build_optimizer(
        config.optim, config.train.steps, param_axes=trainable_part(param_logical_axes(abstract_state), trainable),
        param_shapes=trainable_part(shapes, trainable))
    graphdef, state, shardings = init_train_state(config.model, config.train.seed, mesh, optimizer, trainable)
    start, notes = 0, []
    topology = {"processes": jax.process_count(), "devices": jax.device_count(), "mesh": dict(mesh.shape)}
    if choice is not None:
        state, start, notes = _restore_newest_complete(config, checkpointer, choice, incomplete, state, iterator)
        notes.append(topology_note(checkpointer.restored_topology, topology, start))
    else:  # a model that starts from a checkpoint (its kind's base) takes its weights now
        state = {**state, "params": start_params(config.model, state["params"], shardings["params"])}
    if jax.process_index() == 0:
        save_config(config, Path(config.train.run_dir) / "config.yaml")  # the first write: the restore succeeded
    last_step = config.train.exit_at_step or config.train.steps
    step_fn = jax.jit(make_train_step(graphdef, optimizer, schedule, grad_accum=config.train.grad_accum,
                                      trainable=trainable),
                      in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None),
                      donate_argnums=0)
    logger = MetricsLogger(config.train.run_dir, config.log, total_steps=config.train.steps, start_step=start,
                           primary=jax.process_index() == 0)
    for note in notes + context_parallel_notes(config.model.mixers, mesh.shape["context"]):
        logger.message(note)
    logger.message(
        f"model: {count_params(state['params']):,} parameters, mixers {list(config.model.mixers)}; "
        f"{describe_source(config.data)}; mesh {dict(mesh.shape)}; "
        f"{'resuming from step ' + str(start) if start else 'starting'} towards step {last_step}")
    recorder = _StepRecorder(config, logger, start=start, last_step=last_step, num_devices=mesh.size,
                             checkpoint_dir=checkpointer.directory, compiles=compiles)
    try:
        interrupted_by = _steps(config, state, step_fn, iterator, batch_sharding, checkpointer, recorder, stop,
                                range(start + 1, last_step + 1), topology)
    except BaseException:
        with contextlib.suppress(OSError):  # the error in flight (a full disk, say) is the one to report
            logger.close()
        raise
    logger.close()
    losses = recorder.losses
    steps = sorted(losses)
    return {"start_step": start, "end_step": steps[-1] if steps else start, "losses": losses,
            "first_loss": losses[steps[0]] if steps else None, "last_loss": losses[steps[-1]] if steps else None,
            "interrupted_by": interrupted_by, "last_saved": recorder.last_saved, "compiles": compiles.as_metrics()}


def _topology_text(topology: dict) -> str:
    return f"{topology['processes']} process(es) x {topology['devices']} devices, mesh {topology['mesh']}"


def topology_note(saved: dict | None, now: dict, step: int) -> str:
    """The resume's log line about the topology: the checkpoint's and this run's."""
    if saved is None:
        return f"topology: step {step} was saved before topologies were recorded; now {_topology_text(now)}"
    if saved == now:
        return f"topology: {_topology_text(now)}, as when step {step} was saved"
    return (f"topology: step {step} was saved by {_topology_text(saved)}; resuming on {_topology_text(now)} (the "
            "state is restored onto the new shardings and the data continues at the same global position)")


def _steps(config: Config, state, step_fn, iterator, batch_sharding, checkpointer: Checkpointer,
           recorder: _StepRecorder, stop: StopFlag, steps: range, topology: dict) -> str | None:
    """The steps; a checkpoint every ``checkpoint.every_steps``, at the end and on a signal, deferred while
    the collapse guard finds the latest step anomalous (so a suspect state never rotates good ones out).

    Returns the name of the signal that stopped the run before its last step, else None: a signal that
    arrives once the last step has run (while its checkpoint is written) changes nothing."""
    logger, config_dict, pending, owed = recorder.logger, to_dict(config), None, False
    if stop.signal_name and jax.process_count() == 1:  # several processes first agree on a step (AgreedStop)
        logger.message(f"{stop.signal_name} received before the first step: nothing was saved; run the same "
                       "command again to start.")
        return stop.signal_name
    interrupted_by, agreed = None, AgreedStop(stop)
    for step in steps:
        state, metrics = step_fn(state, global_batch(next(iterator), batch_sharding, config.train.batch_size))
        if step == steps[0]:
            recorder.compiled()  # the train step is compiled (or read back) before its first dispatch returns
        stopping = agreed.should_stop(step)  # the same answer on every process
        if pending is not None:
            recorder.record(*pending)  # the previous step's metrics, read while this one runs
        pending = (step, metrics)
        if owed or step % config.checkpoint.every_steps == 0 or step == steps[-1] or stopping:
            recorder.record(*pending)
            pending = None
            owed = recorder.guard.suspicious
            if owed:
                logger.message(f"checkpoint at step {step} deferred: {recorder.guard.streak[-1]}")
            else:
                checkpointer.save(step, state, iterator, config_dict, topology)
                recorder.last_saved = step
        if stopping:
            saved = (f"checkpoint saved at step {step}" if recorder.last_saved == step else
                     f"step {step} is anomalous and was not saved; the last checkpoint is step {recorder.last_saved}")
            if step != steps[-1]:
                interrupted_by = stop.reason
                why = f"{stop.signal_name} received" if stop.signal_name else f"stopping for {stop.elsewhere}"
                logger.message(f"{why}: {saved}; run the same command again to resume.")
            break
    if pending is not None:
        recorder.record(*pending)
    if owed:
        logger.message(f"the last step is anomalous and was not saved; the last checkpoint is step "
                       f"{recorder.last_saved}")
    checkpointer.wait()
    return interrupted_by
