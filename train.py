"""Train a model: ``python train.py [--config configs/X.yaml] [key.sub=value ...]``.

With no arguments it trains the default: a small Transformer++ on the Python standard library's
own source files, byte-level, on whatever devices are present (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import sys

from seqmodels.config import ConfigError


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file stating what differs from the defaults")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=20 model.d_model=256")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.config_io import help_text, load_config
    if args.help_config:
        print(help_text())
        return 0
    from seqmodels.launch import initialize_distributed
    try:
        initialize_distributed()  # one process of several (JAX_COORDINATOR_ADDRESS, SLURM, a TPU pod): join
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from seqmodels.data.corpus import DataError
    from seqmodels.hf.init_from import explicit_model_keys, resolve_init_from
    from seqmodels.training.checkpoint import CheckpointError
    from seqmodels.training.loop import TrainingDiverged, train
    try:
        config = resolve_init_from(load_config(args.config, args.overrides),
                                   explicit_model_keys(args.config, args.overrides))
        summary = train(config)
    except (ConfigError, DataError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    losses = [summary["losses"][step] for step in sorted(summary["losses"])]
    if losses:
        window = max(1, min(10, len(losses) // 4))
        print(f"done: steps {summary['start_step'] + 1}..{summary['end_step']}, loss "
              f"{summary['first_loss']:.4f} -> {summary['last_loss']:.4f} (mean of the first {window} steps "
              f"{sum(losses[:window]) / window:.4f}, of the last {window} {sum(losses[-window:]) / window:.4f}); "
              f"run directory {config.train.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
