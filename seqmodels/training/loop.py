"""The training loop: validate -> mesh -> sharded state -> (resume) -> steps -> checkpoints and metrics.

Everything that can be wrong with the input (config, data source, vocabulary, batch layout,
an existing checkpoint of another architecture) is checked before anything is written.
Metrics of step s are read back after step s + 1 is dispatched, so the host never stalls the
device except at checkpoints, where the step's loss is checked before its state is saved: a
checkpoint never holds a state reached through a non-finite loss.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import jax
from flax import nnx
from jax.sharding import NamedSharding

from seqmodels.config import Config, ConfigError
from seqmodels.config_io import save_config, to_dict
from seqmodels.data.pipeline import describe_source, make_train_dataset, required_vocab_size
from seqmodels.mixers import check_mixer_names
from seqmodels.models import flops_per_token
from seqmodels.optim.build import build_optimizer
from seqmodels.sharding import logical_spec, make_mesh, param_logical_axes
from seqmodels.training.batches import data_shard, global_batch
from seqmodels.training.checkpoint import Checkpointer, CheckpointError
from seqmodels.training.flops import mfu, peak_flops_per_device
from seqmodels.training.metrics import MetricsLogger
from seqmodels.training.state import abstract_model, count_params, init_train_state
from seqmodels.training.step import make_train_step


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN or infinite."""


class _StopFlag:
    """Set by SIGTERM / SIGINT; the loop checkpoints and stops at the next step boundary."""

    def __init__(self):
        self.signal_name = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        self.signal_name = signal.Signals(signum).name

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def validate(config: Config, mesh) -> None:
    """Checks that need more than one config section; raise ``ConfigError``."""
    check_mixer_names(config.model.mixers)
    vocab = required_vocab_size(config.data)
    if config.model.vocab_size < vocab:
        raise ConfigError(f"model.vocab_size={config.model.vocab_size} is smaller than the vocabulary of "
                          f"data.source={config.data.source} ({vocab}); set model.vocab_size >= {vocab}")
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = config.train.batch_size // config.train.grad_accum
    if rows % data_parallel:
        raise ConfigError(f"train.batch_size={config.train.batch_size} / train.grad_accum={config.train.grad_accum} "
                          f"= {rows} rows per micro-batch must be divisible by mesh data x fsdp = {data_parallel}")


def _open_checkpoints(config: Config) -> tuple[Checkpointer | None, int | None]:
    """The run's checkpointer and latest step if checkpoints exist (after checking they fit the model)."""
    if not (Path(config.train.run_dir) / "checkpoints").is_dir():
        return None, None
    checkpointer = Checkpointer(config.train.run_dir, config.checkpoint)
    latest = checkpointer.latest_step()
    if latest is None:
        return checkpointer, None
    if not config.checkpoint.resume:
        raise CheckpointError(f"{config.train.run_dir} already holds checkpoints (latest step {latest}) and "
                              "checkpoint.resume=false; choose a new train.run_dir or set checkpoint.resume=true")
    checkpointer.check_architecture(latest, to_dict(config)["model"])
    checkpointer.check_process_count(latest)
    return checkpointer, latest


def train(config: Config) -> dict:
    """Run (or resume) training as configured; returns a summary with the first and last losses."""
    mesh = make_mesh(config.mesh)
    validate(config, mesh)
    batch_sharding = NamedSharding(mesh, logical_spec(("batch", None)))
    shard, shards = data_shard(batch_sharding, config.train.batch_size)  # processes holding the same rows share one
    dataset = make_train_dataset(config.data, batch_size=config.train.batch_size // shards, process_index=shard,
                                 process_count=shards)
    iterator = iter(dataset)
    checkpointer, latest = _open_checkpoints(config)
    run_dir = Path(config.train.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        save_config(config, run_dir / "config.yaml")
    checkpointer = checkpointer or Checkpointer(run_dir, config.checkpoint)
    with jax.set_mesh(mesh):
        return _run(config, mesh, iterator, checkpointer, latest, batch_sharding)


class _StepRecorder:
    """Checks each step's metrics for NaN/inf, keeps the losses, and logs every ``log.every_steps``."""

    def __init__(self, config: Config, logger: MetricsLogger, *, start: int, last_step: int, num_devices: int,
                 checkpoint_dir):
        self.config, self.logger, self.last_step = config, logger, last_step
        self.checkpoint_dir, self.last_saved = checkpoint_dir, start or None
        self.tokens_per_step = config.train.batch_size * config.data.seq_len
        self.flops_per_token = flops_per_token(config.model, config.data.seq_len)
        self.peak = peak_flops_per_device(config.log.peak_flops_per_device, config.model.compute_dtype)
        self.num_devices = num_devices
        self.losses: dict[int, float] = {}
        self.clock = (time.perf_counter(), start)

    def record(self, step: int, metrics) -> None:
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
            kept = f"step {self.last_saved} in {self.checkpoint_dir}" if self.last_saved else "none was saved yet"
            raise TrainingDiverged(
                f"loss={values['loss']} grad_norm={values['grad_norm']} at step {step}: training diverged and "
                f"stopped. The last good checkpoint is kept ({kept}); try a lower optim.learning_rate, "
                "a longer optim.warmup_steps or optim.grad_clip > 0.")
        self.losses[step] = values["loss"]
        if step % self.config.log.every_steps and step != self.last_step:
            return
        now, since = time.perf_counter(), self.clock
        tokens_per_second = self.tokens_per_step * (step - since[1]) / max(now - since[0], 1e-9)
        values.update(tokens_per_second=tokens_per_second,
                      step_time=(now - since[0]) / max(step - since[1], 1),
                      mfu=mfu(tokens_per_second, self.flops_per_token, self.peak, self.num_devices))
        self.clock = (now, step)
        self.logger.log(step, values)
        self.logger.advance(step, values["loss"], tokens_per_second)


def _run(config: Config, mesh, iterator, checkpointer: Checkpointer, latest: int | None, batch_sharding) -> dict:
    _, abstract_state = abstract_model(config.model, config.train.seed)
    optimizer, schedule = build_optimizer(
        config.optim, config.train.steps, param_axes=param_logical_axes(abstract_state),
        param_shapes=jax.tree.map(lambda x: tuple(x.shape), nnx.to_pure_dict(abstract_state)))
    graphdef, state, shardings = init_train_state(config.model, config.train.seed, mesh, optimizer)
    if latest is not None:
        state = checkpointer.restore(latest, state, iterator)
    elif config.model.init_from:
        from seqmodels.hf.init_from import init_params
        state = {**state, "params": init_params(config.model, shardings["params"])}
    start, last_step = latest or 0, config.train.exit_at_step or config.train.steps
    step_fn = jax.jit(make_train_step(graphdef, optimizer, schedule, grad_accum=config.train.grad_accum),
                      in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None),
                      donate_argnums=0)
    logger = MetricsLogger(config.train.run_dir, config.log, total_steps=config.train.steps, start_step=start,
                           primary=jax.process_index() == 0)
    logger.message(
        f"model: {count_params(state['params']):,} parameters, mixers {list(config.model.mixers)}; "
        f"{describe_source(config.data)}; mesh {dict(mesh.shape)}; "
        f"{'resuming from step ' + str(start) if latest else 'starting'} towards step {last_step}")
    recorder = _StepRecorder(config, logger, start=start, last_step=last_step, num_devices=mesh.size,
                             checkpoint_dir=checkpointer.directory)
    config_dict, stop, pending = to_dict(config), _StopFlag(), None
    try:
        for step in range(start + 1, last_step + 1):
            state, metrics = step_fn(state, global_batch(next(iterator), batch_sharding, config.train.batch_size))
            if pending is not None:
                recorder.record(*pending)  # the previous step's metrics, read while this one runs
            pending = (step, metrics)
            if step % config.checkpoint.every_steps == 0 or step == last_step or stop.signal_name:
                recorder.record(*pending)
                pending = None
                checkpointer.save(step, state, iterator, config_dict)
                recorder.last_saved = step
            if stop.signal_name:
                logger.message(f"{stop.signal_name} received: checkpoint saved at step {step}; "
                               "run the same command again to resume.")
                break
    finally:
        stop.restore()
        checkpointer.close()
        logger.close()
    losses = recorder.losses
    steps = sorted(losses)
    return {"start_step": start, "end_step": steps[-1] if steps else start, "losses": losses,
            "first_loss": losses[steps[0]] if steps else None, "last_loss": losses[steps[-1]] if steps else None,
            "interrupted_by": stop.signal_name}
