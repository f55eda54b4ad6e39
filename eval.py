"""Evaluate a trained run: ``python eval.py --run runs/x [--step N] [--out results.json]``.

Loads the run's resolved config and its latest (or ``--step``) checkpoint, then runs the suites:
``perplexity`` (held-out loss, perplexity and loss per position bucket, plus a PNG plot beside ``--out``),
``recall`` (answer accuracy on held-out MQAR / selective-copying examples built from the run's
``data.seq_len`` and ``data.synthetic``: the run's own task, or both when it trained on text) and
``cfl`` (accept/reject accuracy per language of ``data.cfl.languages`` and string length ``--lengths``,
on ``--examples`` fresh strings per cell drawn with ``--cfl-seed``) and ``ahn`` (an AHN run: loss beyond
the window at ``--ahn-multiples`` x ``--ahn-window`` tokens for full attention, sliding window alone and
AHN, needle retrieval from before the window, FLOPs and cache bytes at 32k / 128k tokens; also a
markdown table beside ``--out`` as ``<stem>_ahn.md``) and ``ruler`` (RULER's synthetic tasks
``--ruler-tasks`` at the prompt lengths ``--lengths`` in the run's tokens, capped at ``model.max_seq_len``,
``--ruler-examples`` per needle depth of ``--ruler-depths``, from ``--ruler-seed``; greedy decoding scored
by RULER's string match, with 95 % bootstrap intervals; a task x length table beside ``--out`` as
``<stem>_ruler.md`` and a depth x length heatmap per task as ``<stem>_ruler_<task>.png``; on an AHN run
``--ahn-mode swa`` or ``teacher`` decodes its sliding-window or full-attention baseline from the same weights).
The perplexity suite reads the held-out sample of ``data.heldout_seed`` (``seqmodels.data.heldout_sample``)
and gives a 95 % bootstrap interval over its documents.
Writes JSON to ``--out`` (default ``<run>/eval.json``) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from seqmodels.config_base import ConfigError


def _perplexity(model, config, args) -> dict:
    from seqmodels.evaluation.perplexity import evaluate_perplexity
    return {"perplexity": evaluate_perplexity(model, config, batch_size=args.batch_size,
                                              max_batches=args.max_batches)}


def _recall(model, config, args) -> dict:
    from seqmodels.evaluation.recall import evaluate_recall
    return {"recall": evaluate_recall(model, config, batch_size=args.batch_size, max_batches=args.max_batches)}


def _cfl(model, config, args) -> dict:
    from seqmodels.evaluation.cfl import evaluate_cfl
    return {"cfl": evaluate_cfl(model, config.data.cfl.languages, args.lengths_list, num_examples=args.examples,
                                seed=args.cfl_seed, batch_size=args.batch_size), "cfl_seed": args.cfl_seed}


def _ahn(model, config, args) -> dict:
    from seqmodels.evaluation.ahn import evaluate_ahn
    return {"ahn": evaluate_ahn(model, config, window=args.ahn_window, multiples=args.ahn_multiples_list,
                                batch_size=args.batch_size, max_batches=args.max_batches,
                                retrieval_examples=args.needles)}


def _ruler(model, config, args) -> dict:
    from seqmodels.evaluation.ruler import evaluate_ruler
    if config.model.kind == "ahn":
        from seqmodels.models.ahn import with_mode
        model = with_mode(model, args.ahn_mode, max(args.lengths_list))

    def report(task, length, cell, seconds):
        print(f"ruler: {task} at {length} tokens: {cell['score']:.2f} over {cell['examples']} examples "
              f"({seconds:.0f} s)", file=sys.stderr, flush=True)

    result = evaluate_ruler(model, config, tasks=args.ruler_tasks_list, lengths=args.lengths_list,
                            depths=args.ruler_depths_list, per_depth=args.ruler_examples, seed=args.ruler_seed,
                            batch_size=args.batch_size, on_cell=report)
    for length, why in result["skipped_lengths"].items():
        print(f"ruler: length {length} left out: {why}", file=sys.stderr)
    if config.model.kind == "ahn":
        result["ahn_mode"] = args.ahn_mode
    return {"ruler": result}


# suite -> run(model, config, args) -> its entries of the results; suites run in this order
SUITES = {"perplexity": _perplexity, "recall": _recall, "cfl": _cfl, "ahn": _ahn, "ruler": _ruler}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory written by train.py")
    parser.add_argument("--step", type=int, help="checkpoint step (default: latest)")
    parser.add_argument("--suites", default="perplexity", help=f"comma-separated, from {tuple(SUITES)}")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-batches", type=int, default=16)
    parser.add_argument("--lengths", default="16,32,48,64,96,128",
                        help="cfl: string lengths to evaluate; ruler: prompt + answer lengths in the run's tokens "
                             "(e.g. 1024,2048,4096)")
    parser.add_argument("--examples", type=int, default=256, help="cfl: strings per language and length")
    parser.add_argument("--cfl-seed", type=int, default=1234,
                        help="cfl: seed of the evaluation strings (experiments/cfl/run.py's --eval-seed default is 1234)")
    parser.add_argument("--ahn-window", type=int, help="ahn: the window to evaluate (default: model.ahn.window)")
    parser.add_argument("--ahn-multiples", default="2,4,8", help="ahn: evaluation lengths as multiples of the window")
    parser.add_argument("--needles", type=int, default=16, help="ahn: needle retrieval examples")
    parser.add_argument("--ahn-mode", default="ahn", choices=("ahn", "swa", "teacher"),
                        help="ruler on an AHN run: decode as AHN, as sliding window + sinks alone (compressors "
                             "off) or as the teacher (full attention); seqmodels.models.ahn.with_mode")
    parser.add_argument("--ruler-tasks", default="all", help="ruler: comma-separated tasks, or all (see "
                                                                  "seqmodels.data.ruler_tasks.TASKS)")
    parser.add_argument("--ruler-depths", default="0,0.25,0.5,0.75,1", help="ruler: needle depths (fractions)")
    parser.add_argument("--ruler-examples", type=int, default=4, help="ruler: examples per task, length and depth")
    parser.add_argument("--ruler-seed", type=int, default=42, help="ruler: seed of the prompts (RULER's default 42)")
    parser.add_argument("--out", help="JSON path (default: <run>/eval.json); the perplexity plot is written "
                                      "beside it as <stem>_loss_by_position.png")
    return parser.parse_args(argv)


# What a suite needs of the run's data, beyond a model kind that lists it (seqmodels.models.kinds): (test, in words).
DATA_NEEDS = {"cfl": (lambda config: config.data.source == "cfl",
                      "a run trained on data.source=cfl (its accept/reject tokens)"),
              "ruler": (lambda config: _encodes_text(config),
                        "a run trained on text encoded by data.tokenizer (the prompts are text)")}


def _encodes_text(config) -> bool:
    from seqmodels.data.sources import get_source
    return get_source(config.data.source).encodes_text


def check_args(args) -> tuple[list[str], list[int]]:
    """``(suites, lengths)`` from the arguments; raise ``ConfigError`` naming the flag that is wrong."""
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    if not suites:
        raise ConfigError(f"--suites {args.suites!r} names no suite; choose from {list(SUITES)}")
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise ConfigError(f"unknown suite(s) {unknown}; choose from {list(SUITES)}")
    for flag in ("batch_size", "max_batches", "examples", "needles", "ruler_examples"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    try:
        lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        raise ConfigError(f"--lengths {args.lengths!r}: expected comma-separated integers, e.g. 16,32,64") from None
    if any(n < 1 for n in lengths):
        raise ConfigError(f"--lengths {args.lengths!r}: every length must be >= 1")
    try:
        args.ahn_multiples_list = [int(n) for n in args.ahn_multiples.split(",")]
    except ValueError:
        raise ConfigError(f"--ahn-multiples {args.ahn_multiples!r}: expected comma-separated integers, e.g. 2,4,8") \
            from None
    if any(n < 2 for n in args.ahn_multiples_list):
        raise ConfigError(f"--ahn-multiples {args.ahn_multiples!r}: every multiple must be >= 2 (the window itself "
                          "leaves nothing beyond it)")
    _check_ruler_args(args)
    return suites, lengths


def _check_ruler_args(args) -> None:
    """``args.ruler_tasks_list`` / ``args.ruler_depths_list`` from their flags; ``ConfigError`` naming a bad one."""
    from seqmodels.data.ruler_tasks import TASKS
    names = [t.strip() for t in args.ruler_tasks.split(",") if t.strip()]
    args.ruler_tasks_list = list(TASKS) if names == ["all"] else names
    unknown = [t for t in args.ruler_tasks_list if t not in TASKS]
    if unknown or not args.ruler_tasks_list:
        raise ConfigError(f"--ruler-tasks {args.ruler_tasks!r}: unknown or no task(s) {unknown}; choose from all, "
                          f"{', '.join(TASKS)}")
    try:
        args.ruler_depths_list = [float(d) for d in args.ruler_depths.split(",")]
    except ValueError:
        raise ConfigError(f"--ruler-depths {args.ruler_depths!r}: expected comma-separated fractions, e.g. 0,0.5,1") \
            from None
    if any(not 0.0 <= d <= 1.0 for d in args.ruler_depths_list):
        raise ConfigError(f"--ruler-depths {args.ruler_depths!r}: every depth must be in [0, 1]")
    if args.ruler_seed < 0:
        raise ConfigError(f"--ruler-seed must be >= 0, got {args.ruler_seed}")


def _unmet_need(suite: str, config) -> str | None:
    """What ``suite`` needs that the run lacks: a kind that lists it, then its data (None: it fits)."""
    from seqmodels.models import kinds_measured_by, model_kind
    if suite not in model_kind(config.model).suites:
        return " or ".join(f"{kind.description} (model.kind={kind.name})" for kind in kinds_measured_by(suite))
    fits, needs = DATA_NEEDS.get(suite, (lambda config: True, ""))
    return None if fits(config) else needs


def check_suites_fit(suites, config, run_dir) -> None:
    """``ConfigError`` naming the first suite that cannot evaluate the run, what it needs and what fits."""
    from seqmodels.models import model_kind
    for suite in suites:
        needs = _unmet_need(suite, config)
        if needs is not None:
            what = f"model.kind={config.model.kind}" + (", data.source=cfl" if config.data.source == "cfl" else "")
            usable = " or ".join(s for s in model_kind(config.model).suites if _unmet_need(s, config) is None)
            raise ConfigError(f"suite {suite!r} needs {needs}; this run is {what}: use --suites "
                              f"{usable or 'another suite'} ({run_dir})")


def check_ahn_mode(args, config) -> None:
    """``ConfigError`` when ``--ahn-mode`` asks a run that is not AHN for a baseline it does not have."""
    if args.ahn_mode != "ahn" and config.model.kind != "ahn":
        raise ConfigError(f"--ahn-mode {args.ahn_mode} needs an AHN run (model.kind=ahn); this run is "
                          f"model.kind={config.model.kind}: leave --ahn-mode out")


def check_out(out: Path) -> None:
    """``ConfigError`` when ``--out`` can never be written (a directory): said before any suite runs."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give the path of the JSON file to write, e.g. "
                          f"{out / 'eval.json'} (the plot goes beside it)")


def write_results(results: dict, out: Path) -> None:
    """Write ``out`` (and the perplexity plot, AHN table, RULER table and heatmaps beside it) only now that every suite has run.

    Each file is written to a hidden temporary beside it and renamed into place, so a reader never sees
    a partial file; when any write fails, every temporary is removed and no file of this evaluation is left.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    writes = []  # (temporary, final)

    def temporary(final: Path) -> Path:
        path = final.with_name(f".{final.stem}.{os.getpid()}.tmp{final.suffix}")  # the suffix says the format
        writes.append((path, final))
        return path

    try:
        if "perplexity" in results:
            from seqmodels.evaluation.perplexity import plot_loss_by_position
            plot_loss_by_position(results["perplexity"], temporary(out.with_name(out.stem + "_loss_by_position.png")))
        if "ahn" in results:
            from seqmodels.evaluation.ahn import markdown_table
            temporary(out.with_name(out.stem + "_ahn.md")).write_text(markdown_table(results["ahn"]))
        if "ruler" in results:
            from seqmodels.evaluation.ruler import markdown_table as ruler_table, plot_heatmap
            temporary(out.with_name(out.stem + "_ruler.md")).write_text(ruler_table(results["ruler"]))
            for task in results["ruler"]["tasks"]:
                plot_heatmap(results["ruler"], task, temporary(out.with_name(f"{out.stem}_ruler_{task}.png")))
        temporary(out).write_text(json.dumps(results, indent=2))
        for path, final in writes:
            path.replace(final)
    except BaseException:
        for path, _ in writes:
            path.unlink(missing_ok=True)
        raise


def main(argv=None) -> int:
    from seqmodels.training.streams import quiet_when_closed
    with quiet_when_closed():  # a reader that closes stdout or stderr silences the output, never the work
        return _main(argv)


def _main(argv) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.data.errors import DataError
    from seqmodels.runs.checkpoints import CheckpointError
    from seqmodels.runs.load import load_run
    run_dir = Path(args.run)
    out = Path(args.out) if args.out else run_dir / "eval.json"
    from seqmodels.compilation import use_compilation_cache
    try:
        use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla
        suites, args.lengths_list = check_args(args)
        check_out(out)
        config, model, step = load_run(run_dir, step=args.step)
        check_suites_fit(suites, config, run_dir)
        check_ahn_mode(args, config)
        results = {"run": str(run_dir), "step": step}
        for name, run in SUITES.items():
            if name in suites:
                results.update(run(model, config, args))
        write_results(results, out)
    except (ConfigError, DataError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: cannot write the results to {out}: {error.strerror or error}; choose a writable --out "
              "(the plot goes beside it)", file=sys.stderr)
        return 2
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
