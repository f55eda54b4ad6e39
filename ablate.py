"""Run a sweep: ``python ablate.py --sweep configs/sweeps/NAME.yaml [--jobs N] [--only VARIANT] [--report-only]``.

The sweep file (``seqmodels.sweeps.spec``) names a base config, variants (name -> overrides), seeds, a
budget (tokens, or FLOPs so that variants of different cost get equal compute) and the eval suites.
Every variant is validated before any run starts. Each (variant, seed) run trains under
``runs/sweeps/NAME/VARIANT/seed<S>/`` and is evaluated (``seqmodels.sweeps.runner``); a finished run is
skipped, an interrupted one resumes from its checkpoint, a failed one is reported and does not stop
the others. ``--jobs N`` runs N at a time, each single-threaded on CPU. Then ``results/sweeps/NAME/``
gets ``results.json``, ``table.md`` and plots (``seqmodels.sweeps.report``). ``--report-only`` writes
the report from what the runs left, running nothing.

Exit status: 0 when every selected run is done, 1 when any failed or hit the time limit, 2 when the
sweep file is refused (nothing ran), 130 when interrupted (Ctrl-C: the runs save checkpoints; rerun
to resume).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

EXIT_DONE, EXIT_SOME_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, help="sweep YAML, e.g. configs/sweeps/memory.yaml")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each single-threaded (default 1)")
    parser.add_argument("--only", action="append", default=[], metavar="VARIANT",
                        help="run only this variant (repeatable); the report still covers every variant")
    parser.add_argument("--report-only", action="store_true", help="write the report from existing runs; run nothing")
    parser.add_argument("--runs-dir", default="runs/sweeps", help="root of the run directories (default runs/sweeps)")
    parser.add_argument("--results-dir", default="results/sweeps", help="root of the reports (default results/sweeps)")
    return parser.parse_args(argv)


def run_all(specs, jobs: int, time_limit_minutes: float) -> list[dict]:
    """Execute ``specs`` (skipping finished ones) ``jobs`` at a time under a progress bar; return their statuses."""
    from tqdm import tqdm

    from seqmodels.sweeps.runner import execute, is_finished, read_status

    pending = [s for s in specs if not is_finished(s)]
    statuses = [read_status(s) for s in specs if is_finished(s)]
    if len(pending) < len(specs):
        print(f"ablate: {len(specs) - len(pending)} of {len(specs)} runs already done, skipped", flush=True)
    bar = tqdm(total=len(specs), initial=len(specs) - len(pending), unit="run", desc="sweep", dynamic_ncols=True,
               file=sys.stdout)
    not_done = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(execute, spec, time_limit_minutes if spec.variant.time_limit_minutes is None
                               else spec.variant.time_limit_minutes): spec for spec in pending}
        for future in as_completed(futures):
            spec = futures[future]
            try:
                status = future.result()
            except Exception as error:  # noqa: BLE001  (one run's crash must not stop the others)
                status = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
            statuses.append(status)
            if status["status"] != "done":
                not_done += 1
                bar.write(f"ablate: {spec.key}: {status['status']}: {status.get('error', '')}")
            bar.update(1)
            bar.set_postfix(not_done=not_done, refresh=True)
    bar.close()
    return statuses


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    from seqmodels.config_base import ConfigError
    from seqmodels.sweeps.report import collect, write_report
    from seqmodels.sweeps.runner import run_specs
    from seqmodels.sweeps.spec import SweepError, load_sweep

    if args.jobs < 1:
        print(f"error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return EXIT_USAGE
    try:
        use_compilation_cache()  # checked before any run starts; each run and evaluation uses the same directory
        sweep = load_sweep(args.sweep)
        selected = [sweep.variant(name).name for name in args.only] or [v.name for v in sweep.variants]
    except (SweepError, ConfigError) as error:
        print(f"error: {error}; nothing was run", file=sys.stderr)
        return EXIT_USAGE
    specs = run_specs(sweep, Path(args.runs_dir))
    for variant in sweep.variants:
        print(f"ablate: {variant.name}: {variant.steps} steps, {variant.parameters:,} parameters, "
              f"{variant.flops_per_token:.3g} forward FLOPs/token", flush=True)
    statuses = []
    if not args.report_only:
        try:
            statuses = run_all([s for s in specs if s.variant.name in selected], args.jobs, sweep.time_limit_minutes)
        except KeyboardInterrupt:
            print("ablate: interrupted; the runs saved checkpoints: run the same command to resume", file=sys.stderr)
            return EXIT_INTERRUPTED
    command = ["python", "ablate.py", *(sys.argv[1:] if argv is None else argv)]
    results = collect(sweep, specs, command, Path.cwd())
    out = Path(args.results_dir) / sweep.name
    written = write_report(results, out)
    print(f"ablate: wrote {', '.join(str(out / name) for name in written)}")
    return EXIT_SOME_FAILED if any(s.get("status") != "done" for s in statuses) else EXIT_DONE


if __name__ == "__main__":
    sys.exit(main())
