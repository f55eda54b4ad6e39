"""CFL recognition with length generalisation: looped vs looped + padding vs fixed depth.

    python experiments/cfl/run.py [--config configs/looped_cfl.yaml] [--out experiments/cfl/results/grid] [--jobs 3]
                                  [key=value ...]

Trains one model per variant on ``data.cfl.languages`` (strings of length <= data.cfl.max_length,
32 in the config) with ``train.py``'s loop, then measures accept/reject accuracy on fresh strings
of each length in ``--lengths`` (default 16 32 48 64 96 128; half positive, hard negatives),
the looped models running loops(N) iterations there. Variants (all from ``configs/looped_cfl.yaml``):

- ``looped``         one shared block, loops(N) = ceil(c log2 N) + d, no padding;
- ``looped_padded``  the same with P(N) = ceil(a N^e) padding tokens (a = 1, e = 1 unless configured);
- ``fixed_params``   the same three distinct blocks (prelude, block, coda) run once: same parameter count;
- ``fixed_compute``  prelude + loops(N_train) distinct blocks + coda: the looped model's compute at the
                     longest training length, fixed for every N (more parameters).

Writes ``<out>/cfl.json`` (everything, timings included), ``<out>/cfl.md`` (accuracy per language x
length x model) and ``<out>/cfl.png`` (accuracy against length). Each variant trains in its own
single-threaded process, ``--jobs`` at a time (default 3: the three default variants at once, which
balances a 2-core CPU better than two jobs and a straggler). ``fixed_params`` runs when asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from seqmodels.runs.portable import portable

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"

VARIANTS = ("looped", "looped_padded", "fixed_params", "fixed_compute")
DEFAULT_VARIANTS = ("looped", "looped_padded", "fixed_compute")
SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false"


def variant_overrides(name: str, base) -> list[str]:
    """Config overrides that turn the base config into variant ``name``."""
    from seqmodels.models.looped import num_loops
    looped = base.model.looped
    if name == "looped":
        return ["model.looped.padding_scale=0"]
    if name == "looped_padded":
        return [f"model.looped.padding_scale={looped.padding_scale or 1.0}"]
    fixed = ["model.looped.padding_scale=0", "model.looped.loop_schedule=fixed"]
    if name == "fixed_params":
        return fixed + ["model.looped.fixed_loops=1"]
    if name == "fixed_compute":
        depth = num_loops(looped, base.data.cfl.max_length)
        return fixed + [f"model.looped.fixed_loops={depth}", "model.looped.share_weights=false"]
    raise ValueError(f"unknown variant {name!r}; choose from {VARIANTS}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "looped_cfl.yaml"))
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, from {VARIANTS}")
    parser.add_argument("--lengths", default="16,32,48,64,96,128", help="evaluation lengths N")
    parser.add_argument("--examples", type=int, default=256, help="evaluation strings per language and length")
    parser.add_argument("--eval-seed", type=int, default=1234)
    parser.add_argument("--jobs", type=int, default=3, help="variants trained at the same time")
    parser.add_argument("--out", default=str(RESULTS / "grid"))
    parser.add_argument("--runs", default=str(ROOT / "runs" / "cfl"), help="run directories (checkpoints)")
    parser.add_argument("--joint", action="store_true",
                        help="one model per variant on all languages (default: one model per language)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every variant")
    return parser.parse_args(argv)


def variant_config(args, name: str, languages: list[str] | None = None):
    """The config of variant ``name`` (trained on ``languages``, default the config's) and its run directory."""
    from seqmodels.config_io import load_config
    base = load_config(args.config, args.overrides)
    languages = list(languages or base.data.cfl.languages)
    group = "all" if args.joint else "-".join(languages)
    run_dir = Path(args.runs) / name / group
    overrides = [*args.overrides, *variant_overrides(name, base), f"train.run_dir={run_dir}",
                 f"data.cfl.languages=[{', '.join(languages)}]", "checkpoint.resume=false", "log.progress=never"]
    latest = {item.partition("=")[0].strip(): item for item in overrides}  # a later value of a key wins
    return load_config(args.config, list(latest.values()))


def train_and_evaluate(args, name: str, languages: list[str]) -> dict:
    """Train variant ``name`` from scratch on ``languages``; its accuracy at every evaluation length, and costs."""
    import shutil

    from seqmodels.evaluation.cfl import evaluate_cfl
    from seqmodels.runs.load import load_run
    from seqmodels.models.looped import parameter_count
    from seqmodels.training.loop import train
    config = variant_config(args, name, languages)
    shutil.rmtree(config.train.run_dir, ignore_errors=True)
    wall, cpu = time.perf_counter(), time.process_time()
    summary = train(config)
    train_wall, train_cpu = time.perf_counter() - wall, time.process_time() - cpu
    _, model, _ = load_run(config.train.run_dir)
    accuracy = evaluate_cfl(model, languages, [int(n) for n in args.lengths.split(",")],
                            num_examples=args.examples, seed=args.eval_seed)
    return {"languages": languages, "parameters": parameter_count(model), "final_loss": summary["last_loss"],
            "train_wall_seconds": train_wall, "train_cpu_seconds": train_cpu,
            "eval_wall_seconds": time.perf_counter() - wall - train_wall,
            "eval_cpu_seconds": time.process_time() - cpu - train_cpu, "accuracy": accuracy}


def run_worker(args) -> int:
    """Variant ``args.worker``: one model per language (or one for all, ``--joint``); writes its results JSON."""
    from seqmodels.config_io import to_dict
    config = variant_config(args, args.worker)
    languages = list(config.data.cfl.languages)
    groups = [languages] if args.joint else [[language] for language in languages]
    runs = [train_and_evaluate(args, args.worker, group) for group in groups]
    result = {
        "variant": args.worker, "overrides": variant_overrides(args.worker, config),
        "parameters": runs[0]["parameters"], "train_steps": config.train.steps,
        "final_loss": sum(run["final_loss"] for run in runs) / len(runs),
        **{key: sum(run[key] for run in runs) for key in
           ("train_wall_seconds", "train_cpu_seconds", "eval_wall_seconds", "eval_cpu_seconds")},
        "model": to_dict(config)["model"], "runs": runs,
        "accuracy": {language: cells for run in runs for language, cells in run["accuracy"].items()},
    }
    (Path(args.runs) / f"{args.worker}.json").write_text(json.dumps(result, indent=2))
    return 0


def worker_env(cache: Path) -> dict[str, str]:
    """A worker's environment: single-threaded XLA, then the caller's ``XLA_FLAGS`` (a later flag wins, so
    e.g. ``--xla_force_host_platform_device_count=2`` gives each worker two devices), and the project's
    compilation cache (``seqmodels.compilation``) in ``cache``, shared by the workers."""
    from seqmodels.compilation import ENVIRONMENT_VARIABLE
    flags = f"{SINGLE_THREAD_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()
    return dict(os.environ, XLA_FLAGS=flags, PYTHONUNBUFFERED="1", **{ENVIRONMENT_VARIABLE: str(cache)})


def launch(args, names: list[str]) -> dict:
    """Run one worker process per variant, ``args.jobs`` at a time; return their results."""
    import shutil
    cache = Path(args.runs) / "compilation_cache"  # shared by the workers, emptied so that timings start cold
    shutil.rmtree(cache, ignore_errors=True)
    env = worker_env(cache)
    pending, running, failed = list(names), {}, []
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    while pending or running:
        while pending and len(running) < args.jobs:
            name = pending.pop(0)
            log = open(Path(args.runs) / f"{name}.log", "w")
            command = [sys.executable, __file__, "--worker", name, "--config", args.config, "--lengths", args.lengths,
                       "--examples", str(args.examples), "--eval-seed", str(args.eval_seed), "--runs", args.runs,
                       *(["--joint"] if args.joint else []), *args.overrides]
            running[name] = (subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log)
            print(f"[cfl] training {name} (log: {log.name})", flush=True)
        time.sleep(1.0)
        for name, (process, log) in list(running.items()):
            if process.poll() is not None:
                log.close()
                del running[name]
                print(f"[cfl] {name} finished with exit code {process.returncode}", flush=True)
                if process.returncode:
                    failed.append(name)
    if failed:
        raise RuntimeError(f"variants {failed} failed; see their logs in {args.runs}")
    return {name: json.loads((Path(args.runs) / f"{name}.json").read_text()) for name in names}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        from seqmodels.compilation import use_compilation_cache
        use_compilation_cache()  # the driver's cache (worker_env); the evaluations' programs too
        return run_worker(args)
    from experiments.cfl.report import write_markdown, write_plot
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        print(f"error: unknown variants {unknown}; choose from {VARIANTS}", file=sys.stderr)
        return 2
    base = variant_config(args, names[0])  # validates the config and overrides before any work
    start_wall = time.perf_counter()
    start_cpu = os.times()
    results = launch(args, sorted(names, key=lambda n: n != "looped_padded"))  # the slowest first
    end_cpu = os.times()
    report = {
        "command": portable(" ".join(["python", "experiments/cfl/run.py", *(sys.argv[1:] if argv is None else argv)])),
        "wall_seconds": time.perf_counter() - start_wall,
        "cpu_seconds": (end_cpu.children_user + end_cpu.children_system
                        - start_cpu.children_user - start_cpu.children_system),
        "train_lengths": [base.data.cfl.min_length, base.data.cfl.max_length],
        "eval_lengths": [int(n) for n in args.lengths.split(",")], "examples": args.examples,
        "languages": list(base.data.cfl.languages), "variants": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cfl.json").write_text(json.dumps(report, indent=2))
    write_markdown(report, out / "cfl.md")
    write_plot(report, out / "cfl.png")
    print((out / "cfl.md").read_text())
    print(f"[cfl] wall {report['wall_seconds']:.0f} s, CPU {report['cpu_seconds']:.0f} s; wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
