"""Evaluate one sweep run: ``python -m seqmodels.sweeps.evaluate --run DIR --settings JSON --out FILE``.

For every checkpoint step of the run (``--last-only``: the last one) (``checkpoint.every_steps`` apart, so
the sweep's ``eval.points``
of them): held-out loss (``evaluation.perplexity``, ``eval.batch_size`` x ``eval.max_batches`` rows),
giving validation loss against training tokens and FLOPs. At the last step, every suite of
``eval.suites``: ``perplexity`` (loss per position bucket), ``recall`` (``evaluation.recall``: MQAR and
selective copying of ``data.synthetic``), ``needle`` (``evaluation.text_needle``: a number hidden at
each of ``eval.needle.depths`` of held-out text), ``ruler`` (``evaluation.ruler``: ``eval.ruler.tasks`` at
``eval.ruler.lengths``, those above ``model.max_seq_len`` left out). The held-out loss reads the held-out
sample (``data.heldout_sample``) and carries a 95 % bootstrap interval over its documents. The run's own ``metrics.jsonl`` gives tokens/s (median over its logged rows after the first, which
includes the compilation; a run with one row only reports that row, flagged ``includes_compilation``).
Writes ``--out`` as JSON atomically, only once everything has run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from seqmodels.models import flops_per_token


def training_speed(run_dir: Path) -> dict:
    """Median tokens/s and step time over the logged rows, the first row (compilation) left out."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    logged = [r for r in rows if "tokens_per_second" in r]
    if not logged:
        return {"tokens_per_second": None, "logged_steps": len(rows)}
    # With one logged row only, its rate includes the compilation: a lower bound on the steady rate.
    timed = logged[1:] or logged
    return {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in timed),
            "includes_compilation": len(logged) == 1, "logged_steps": len(rows), "last_step": rows[-1]["step"],
            "last_train_loss": rows[-1].get("loss")}


def evaluate_run(run_dir: Path, settings: dict, *, last_only: bool = False) -> dict:
    from seqmodels.runs.load import load_run
    from seqmodels.evaluation.perplexity import evaluate_perplexity
    from seqmodels.runs.checkpoints import RunCheckpoints

    config, _, last = load_run(run_dir)
    checkpoints = RunCheckpoints(run_dir)
    try:
        steps = [last] if last_only else checkpoints.steps()
    finally:
        checkpoints.close()
    tokens_per_step = config.train.batch_size * config.data.seq_len
    train_flops_per_token = 3.0 * flops_per_token(config.model, config.data.seq_len)
    curve, final = [], None
    for step in steps:
        config, model, _ = load_run(run_dir, step=step)
        result = evaluate_perplexity(model, config, batch_size=settings["batch_size"],
                                     max_batches=settings["max_batches"])
        curve.append({"step": step, "tokens": step * tokens_per_step,
                      "flops": step * tokens_per_step * train_flops_per_token, "loss": result["loss"],
                      "loss_interval": [result["interval"]["low"], result["interval"]["high"]]})
        if step == last:
            final = (model, config, result)
    model, config, perplexity = final
    results = {"run": str(run_dir), "step": last, "tokens": last * tokens_per_step, "curve": curve,
               "train_flops_per_token": train_flops_per_token, "speed": training_speed(run_dir)}
    if "perplexity" in settings["suites"]:
        results["perplexity"] = perplexity
    if "recall" in settings["suites"]:
        from seqmodels.evaluation.recall import evaluate_recall
        results["recall"] = evaluate_recall(model, config, batch_size=settings["batch_size"],
                                            max_batches=settings["max_batches"])
    if "needle" in settings["suites"]:
        from seqmodels.evaluation.text_needle import text_needle_accuracy
        needle = settings["needle"]
        results["needle"] = text_needle_accuracy(model, config, length=min(needle["length"], config.data.seq_len),
                                                 depths=needle["depths"], per_depth=needle["per_depth"],
                                                 seed=needle["seed"], batch_size=settings["batch_size"])
    if "ruler" in settings["suites"]:
        from seqmodels.evaluation.ruler import evaluate_ruler
        ruler = settings["ruler"]
        results["ruler"] = evaluate_ruler(model, config, tasks=ruler["tasks"], lengths=ruler["lengths"],
                                          depths=ruler["depths"], per_depth=ruler["per_depth"], seed=ruler["seed"],
                                          batch_size=settings["batch_size"])
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqmodels.sweeps.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--settings", required=True, help="the sweep's eval settings as JSON")
    parser.add_argument("--out", required=True)
    parser.add_argument("--last-only", action="store_true", help="evaluate the last checkpoint only")
    args = parser.parse_args(argv)
    from seqmodels.compilation import use_compilation_cache
    from seqmodels.config import ConfigError
    from seqmodels.data.errors import DataError
    from seqmodels.runs.checkpoints import CheckpointError
    try:
        use_compilation_cache()  # the sweep's other evaluations compiled the same programs: read back
        results = evaluate_run(Path(args.run), json.loads(args.settings), last_only=args.last_only)
    except (ConfigError, DataError, CheckpointError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    temporary = out.with_name(out.name + ".tmp")
    temporary.write_text(json.dumps(results, indent=2))
    temporary.replace(out)
    print(f"evaluated {args.run}: step {results['step']}, loss {results['curve'][-1]['loss']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
