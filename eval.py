"""Evaluate a trained run: ``python eval.py --run runs/x [--step N] [--out results.json]``.

Loads the run's resolved config and its latest (or ``--step``) checkpoint, then runs the suites:
``perplexity`` (held-out loss, perplexity and loss per position bucket, plus a PNG plot),
``recall`` (answer accuracy on held-out MQAR / selective-copying examples built from the run's
``data.seq_len`` and ``data.synthetic``: the run's own task, or both when it trained on text) and
``cfl`` (accept/reject accuracy per language of ``data.cfl.languages`` and string length ``--lengths``,
on ``--examples`` fresh strings per cell drawn with ``--cfl-seed``).
Writes JSON to ``--out`` (default ``<run>/eval.json``) and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from seqmodels.config import ConfigError

SUITES = ("perplexity", "recall", "cfl")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory written by train.py")
    parser.add_argument("--step", type=int, help="checkpoint step (default: latest)")
    parser.add_argument("--suites", default="perplexity", help=f"comma-separated, from {SUITES}")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-batches", type=int, default=16)
    parser.add_argument("--lengths", default="16,32,48,64,96,128", help="cfl: string lengths to evaluate")
    parser.add_argument("--examples", type=int, default=256, help="cfl: strings per language and length")
    parser.add_argument("--cfl-seed", type=int, default=1234,
                        help="cfl: seed of the evaluation strings (experiments/cfl/run.py's --eval-seed default is 1234)")
    parser.add_argument("--out", help="JSON path (default: <run>/eval.json)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        print(f"error: unknown suite(s) {unknown}; choose from {list(SUITES)}", file=sys.stderr)
        return 2
    from seqmodels.data.corpus import DataError
    from seqmodels.evaluation.loading import load_run
    from seqmodels.evaluation.perplexity import evaluate_perplexity, plot_loss_by_position
    from seqmodels.training.checkpoint import CheckpointError
    run_dir = Path(args.run)
    try:
        config, model, step = load_run(run_dir, step=args.step)
        results = {"run": str(run_dir), "step": step}
        if "perplexity" in suites:
            results["perplexity"] = evaluate_perplexity(model, config, batch_size=args.batch_size,
                                                        max_batches=args.max_batches)
            plot_loss_by_position(results["perplexity"], run_dir / "eval_loss_by_position.png")
        if "recall" in suites:
            from seqmodels.evaluation.recall import evaluate_recall
            results["recall"] = evaluate_recall(model, config, batch_size=args.batch_size,
                                                max_batches=args.max_batches)
        if "cfl" in suites:
            from seqmodels.evaluation.cfl import evaluate_cfl
            lengths = [int(n) for n in args.lengths.split(",")]
            results["cfl"] = evaluate_cfl(model, config.data.cfl.languages, lengths, num_examples=args.examples,
                                          seed=args.cfl_seed, batch_size=args.batch_size)
            results["cfl_seed"] = args.cfl_seed
    except (ConfigError, DataError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else run_dir / "eval.json"
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
