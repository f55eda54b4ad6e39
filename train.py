"""Train a model: ``python train.py [--config configs/X.yaml] [key.sub=value ...]``.

With no arguments it trains the default: a small Transformer++ on the Python standard library's
own source files, byte-level, on whatever devices are present (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import os
import sys

from seqmodels.config_base import ConfigError


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file stating what differs from the defaults")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=20 model.d_model=256")
    return parser.parse_args(argv)


# Exit statuses (documented in the README): a scheduler requeues on EXIT_PREEMPTED.
EXIT_DONE = 0  # trained to train.steps (or train.exit_at_step)
EXIT_DIVERGED = 1  # non-finite loss, or the collapse guard stopped the run; the last good checkpoint is kept
EXIT_USAGE = 2  # bad config, data, run directory or checkpoint: nothing was overwritten
EXIT_PREEMPTED = 3  # SIGTERM / SIGINT / SIGHUP (on any process of the run): a checkpoint was saved; rerun to resume
EXIT_ABORTED = 130  # a second SIGINT: stopped at once, without saving


def print_help_config(text: str) -> int:
    """Print ``text``; a closed pipe (``--help-config | head``) is the reader's choice (``quiet_when_closed``)."""
    print(text, flush=True)
    return EXIT_DONE


def main(argv=None, *, standalone: bool = False) -> int:
    """Train as ``argv`` says; returns the exit status. ``standalone`` (``python train.py``): once the run is over,
    SIGTERM / SIGINT are ignored until the process exits, so a signal after the last step changes nothing."""
    from seqmodels.training.streams import quiet_when_closed
    with quiet_when_closed():  # a reader that closes stdout or stderr silences the messages, never the run
        return _main(argv, standalone)


def _main(argv, standalone: bool) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.config_io import help_text
    if args.help_config:
        return print_help_config(help_text())
    from seqmodels.launch import initialize_distributed
    try:
        joined = initialize_distributed()  # one process of several (JAX_COORDINATOR_ADDRESS, SLURM, a TPU pod): join
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    from seqmodels.training.stop import StopFlag
    stop = StopFlag()  # before the heavy imports: a signal during set-up or compilation stops cleanly too
    try:
        from seqmodels.data.errors import DataError
        from seqmodels.runs.checkpoints import CheckpointError
        from seqmodels.training.loop import TrainingDiverged, train
        from seqmodels.training.run_dir import RunDirError
    except KeyboardInterrupt:
        stop.restore()
        print("error: interrupted while starting; nothing was written", file=sys.stderr)
        return EXIT_ABORTED
    try:
        status = _train(args, stop, train, (ConfigError, DataError, CheckpointError, RunDirError), TrainingDiverged)
    finally:
        stop.settle() if standalone else stop.restore()
    if status == EXIT_ABORTED and joined:
        # Not jax.distributed.shutdown: its barrier would hold this process (and the others, blocked in a
        # collective with it) for the shutdown timeout; the others see it lost within the heartbeat timeout.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_ABORTED)
    return status


def interrupted_twice(config) -> str:
    """The message of a second Ctrl-C: what a rerun of the same command does, from what the run directory holds."""
    from seqmodels.runs.checkpoint_check import newest_saved_step
    step = None if config is None else newest_saved_step(config.train.run_dir)
    if step is None:
        return ("error: interrupted twice: stopped at once without saving; no checkpoint of this run directory was "
                "ever saved, so running the same command starts again from the first step")
    return (f"error: interrupted twice: stopped at once without saving; run the same command to resume from the "
            f"checkpoint at step {step}")


def _train(args, stop, train, usage_errors, diverged) -> int:
    from seqmodels.config_io import load_config
    from seqmodels.hf.base import explicit_model_keys, prepare_base, resolve_base, resolve_learning_rate
    config = None  # until the config is built, no run directory is known
    try:
        prepare_base(args.config, args.overrides)  # a base to convert on first use may be the data's tokenizer
        explicit = explicit_model_keys(args.config, args.overrides)  # what the user set, against the base's
        config = resolve_base(load_config(args.config, args.overrides), explicit)
        learning_rate_set = "learning_rate" in explicit_model_keys(args.config, args.overrides, "optim")
        config, note = resolve_learning_rate(config, learning_rate_set)  # pretrained weights: not 3e-3
        if note:
            print(note, flush=True)
        summary = train(config, stop)
    except usage_errors as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        where = error.filename or "a file of train.run_dir"
        print(f"error: {where}: {error.strerror or error}; check that train.run_dir is writable "
              "and its disk has space, then run the same command again", file=sys.stderr)
        return EXIT_USAGE
    except diverged as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        print(interrupted_twice(config), file=sys.stderr)
        return EXIT_ABORTED
    if summary["interrupted_by"]:
        print(f"stopped by {summary['interrupted_by']} after step {summary['end_step']} (exit status "
              f"{EXIT_PREEMPTED}); run directory {config.train.run_dir}", file=sys.stderr)
        return EXIT_PREEMPTED
    losses = [summary["losses"][step] for step in sorted(summary["losses"])]
    if losses:
        window = max(1, min(10, len(losses) // 4))
        print(f"done: steps {summary['start_step'] + 1}..{summary['end_step']}, loss "
              f"{summary['first_loss']:.4f} -> {summary['last_loss']:.4f} (mean of the first {window} steps "
              f"{sum(losses[:window]) / window:.4f}, of the last {window} {sum(losses[-window:]) / window:.4f}); "
              f"run directory {config.train.run_dir}")
    return EXIT_DONE


if __name__ == "__main__":
    sys.exit(main(standalone=True))
