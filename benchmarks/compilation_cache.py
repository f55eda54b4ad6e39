"""What the persistent compilation cache saves: a run's start, cold against warm.

    python benchmarks/compilation_cache.py                 # -> benchmarks/results/compilation_cache.json
    python benchmarks/compilation_cache.py --cases default --repeats 1 --out scratch/cache.json

Each case is ``train.py`` for one step in a process of its own, in a fresh run directory: ``cold`` with an
empty cache directory, then ``warm`` with the directory the cold process filled. Recorded per process: the
compile line the run logs (``compiles: N program(s) in S s of XLA (H of R read back ...)``), the whole
process's wall time (start-up, data, compiles, the step and its checkpoint) and the first step's loss, which
must be bitwise the cold one's. ``--repeats`` pairs are run (default 3); the JSON keeps every process and the
medians. Cases: ``125m`` (d_model 768, 12 heads, 12 attention layers, vocabulary 32,000, batch 1, rows of 256)
and ``default`` (``python train.py``'s own model and data).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CASES = {
    "125m": ["model.d_model=768", "model.num_heads=12", "model.mixers=[attention] * 12", "model.vocab_size=32000",
             "train.batch_size=1", "data.seq_len=256"],
    "default": [],
}
COMPILE_LINE = re.compile(r"compiles: (\d+) program\(s\) in ([0-9.]+) s of XLA \((\d+) of (\d+) read back")


def run_once(overrides: list[str], cache: Path, scratch: Path) -> dict:
    """One ``train.py`` process of one step; its compile line, wall time and first loss."""
    from seqmodels.compilation import ENVIRONMENT_VARIABLE
    run_dir = Path(tempfile.mkdtemp(dir=scratch, prefix="run_"))
    command = [sys.executable, str(ROOT / "train.py"), *overrides, "train.steps=1", f"train.run_dir={run_dir}",
               "log.every_steps=1", "log.progress=never", "log.tensorboard=false", "checkpoint.async_save=false"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, ENVIRONMENT_VARIABLE: str(cache)})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"train.py exited with {done.returncode}: {done.stderr[-2000:]}")
    found = COMPILE_LINE.search(done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"train.py logged no compile line: {done.stdout[-2000:]}")
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    return {"programs": int(found[1]), "compile_seconds": float(found[2]), "cache_served": int(found[3]),
            "cache_requested": int(found[4]), "process_seconds": wall, "loss": first["loss"]}


def measure(name: str, repeats: int, scratch: Path) -> dict:
    pairs = []
    for repeat in range(repeats):
        cache = scratch / f"{name}_cache_{repeat}"
        shutil.rmtree(cache, ignore_errors=True)
        cold = run_once(CASES[name], cache, scratch)
        warm = run_once(CASES[name], cache, scratch)
        pairs.append({"cold": cold, "warm": warm})
        print(f"[cache] {name} #{repeat}: compile {cold['compile_seconds']:.2f} s cold, "
              f"{warm['compile_seconds']:.2f} s warm ({warm['cache_served']} of {warm['cache_requested']} read back); "
              f"process "
              f"{cold['process_seconds']:.1f} s -> {warm['process_seconds']:.1f} s", flush=True)

    def median(kind: str, key: str) -> float:
        return statistics.median(pair[kind][key] for pair in pairs)
    summary = {f"{kind}_{key}": median(kind, key) for kind in ("cold", "warm")
               for key in ("compile_seconds", "process_seconds")}
    summary["compile_ratio"] = summary["warm_compile_seconds"] / summary["cold_compile_seconds"]
    summary["losses_bitwise_equal"] = all(pair["cold"]["loss"] == pair["warm"]["loss"] for pair in pairs)
    return {"overrides": CASES[name], "pairs": pairs, **summary}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=3, help="cold-warm pairs per case (the medians are reported)")
    parser.add_argument("--out", default=str(RESULTS / "compilation_cache.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    names = [name.strip() for name in args.cases.split(",") if name.strip()]
    unknown = [name for name in names if name not in CASES]
    if unknown or not names or args.repeats < 1:
        print(f"error: --cases must name some of {', '.join(CASES)} (got {args.cases!r}) and --repeats must be >= 1",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="compilation_cache_") as scratch:
        cases = {name: measure(name, args.repeats, Path(scratch)) for name in names}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "benchmarks/compilation_cache.py", *(sys.argv[1:] if argv is None else argv)])
    out.write_text(json.dumps({"command": command, "repeats": args.repeats, "cases": cases}, indent=2) + "\n")
    print(f"[cache] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
