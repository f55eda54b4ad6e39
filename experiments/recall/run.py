"""Recall experiment: train each mixer on MQAR at a few (sequence length, key-value pairs) settings, report accuracy.

    OPENBLAS_NUM_THREADS=1 python experiments/recall/run.py --jobs 3    # the default grid -> results/grid/
    python experiments/recall/run.py --mixers attention,mamba2 --settings 64:4 --steps 200
    python experiments/recall/run.py --mixers "attention,titans=atlas;model.atlas.window=1"

The default grid (seven variants x two settings, 300 steps of 32 rows) takes about half an hour on
two busy CPU cores with ``--jobs 3``; ``results/grid/recall.md`` records the exact command.

Each variant is a 2-layer LM (``--layers``) of one mixer, ``--d-model`` wide, trained by
``seqmodels.training.loop.train`` (the same path as ``train.py``) on ``data.source=mqar`` rows of
``seq_len`` tokens holding ``num_pairs`` key-value pairs and ``--queries`` queries, then scored by
the ``recall`` suite of ``eval.py`` on held-out examples (answer-token accuracy, argmax). Variants
are ``name`` (a registered mixer) or ``label=mixer;key=value;...`` (a mixer with config overrides),
so more mixers and their ablations join the table from the command line. ``--jobs N`` trains N runs
at once in separate processes. Writes ``recall.json`` (every run's settings, accuracy, final
training loss and wall time) and ``recall.md`` (accuracy per variant and setting) under ``--out``.

Why ``attention+conv`` is in the default grid: recalling the value after a key takes an induction
circuit, a previous-token head in layer 1 (so the value's position carries its key) and a matching
head in layer 2. The recurrent mixers get the previous token for free from their short causal
convolution. Plain Transformer++ (RoPE, no biases, no absolute positions) must first learn a
content-independent previous-token head, and at this scale sits on the plateau "answer = some
value of this row" (accuracy about 1 / pairs in ``results/grid``; an informal run of 2,500 steps of
32 rows at T=64 with 4 pairs stayed there too). With a short convolution on q, k, v
(``model.attention.conv_kernel=4``) the same 2-layer attention model solves both settings. The
data layout, answer-only loss and positions were checked and are as the task intends.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

from seqmodels.runs.portable import portable

# The delta-rule chunk forms call LAPACK's triangular solve; multi-threaded OpenBLAS on a busy CPU
# spin-waits and makes each call ~1000x slower. One BLAS thread (XLA keeps its own threads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

RESULTS = Path(__file__).resolve().parent / "results"

DEFAULT_MIXERS = ("attention,attention+conv=attention;model.attention.conv_kernel=4,"
                  "mamba2,deltanet,gated_deltanet,muonssm_mamba2,muonssm_gated_deltanet")
LABELS = {"attention": "Transformer++ (attention)",
          "attention+conv": "attention + short conv on q, k, v (K=4)"}


def _split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets: ``"a,b;k=[1, 2]"`` -> ``["a", "b;k=[1, 2]"]``."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return parts + [current]


def parse_variants(text: str) -> list[tuple[str, str, list[str]]]:
    """``"a,label=b;k=v;r=[0, 1]"`` -> ``[("a", "a", []), ("label", "b", ["k=v", "r=[0, 1]"])]``."""
    variants = []
    for item in filter(None, (part.strip() for part in _split_top_level(text))):
        label, _, spec = item.partition("=") if "=" in item.split(";")[0] else ("", "", item)
        mixer, *overrides = [piece.strip() for piece in spec.split(";") if piece.strip()]
        variants.append((label or mixer, mixer, overrides))
    return variants


def parse_settings(text: str) -> list[tuple[int, int]]:
    """``"64:4,128:8"`` -> ``[(64, 4), (128, 8)]`` (seq_len, num_pairs)."""
    settings = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        seq_len, _, pairs = item.partition(":")
        settings.append((int(seq_len), int(pairs)))
    return settings


def run_overrides(args, mixer: str, seq_len: int, pairs: int, run_dir: Path) -> list[str]:
    return [f"model.mixers=[{mixer}] * {args.layers}", f"model.d_model={args.d_model}", f"model.mlp={args.mlp}",
            f"model.num_heads={args.heads}", f"model.vocab_size={args.vocab}", f"model.max_seq_len={seq_len}",
            "data.source=mqar", f"data.seq_len={seq_len}", f"data.synthetic.vocab_size={args.vocab}",
            f"data.synthetic.num_pairs={pairs}",
            f"data.synthetic.num_queries={min(args.queries, (seq_len - 2 * pairs) // 2)}",
            f"data.seed={args.seed}", f"train.seed={args.seed}",
            f"train.steps={args.steps}", f"train.batch_size={args.batch_size}", f"train.run_dir={run_dir}",
            f"optim.learning_rate={args.learning_rate}", f"optim.warmup_steps={args.warmup}",
            f"optim.schedule={args.schedule}",
            "optim.weight_decay=0.1", f"checkpoint.every_steps={args.steps}", "checkpoint.async_save=false",
            "checkpoint.resume=false", f"log.every_steps={max(args.steps // 10, 1)}", "log.progress=never",
            "log.tensorboard=false"]


def run_one(args, label: str, mixer: str, extra: list[str], seq_len: int, pairs: int) -> dict:
    from seqmodels.config_io import load_config
    from seqmodels.runs.load import load_run
    from seqmodels.evaluation.recall import evaluate_recall
    from seqmodels.training.loop import train

    with tempfile.TemporaryDirectory(prefix="recall-") as scratch:
        run_dir = Path(scratch) / "run"
        config = load_config(None, run_overrides(args, mixer, seq_len, pairs, run_dir) + extra)
        start = time.perf_counter()
        summary = train(config)
        trained = time.perf_counter()
        _, model, _ = load_run(run_dir)
        scores = evaluate_recall(model, config, tasks=("mqar",), batch_size=args.batch_size,
                                 max_batches=args.eval_batches)["mqar"]
    return {"variant": label, "mixer": mixer, "overrides": extra, "seq_len": seq_len, "num_pairs": pairs,
            "accuracy": scores["accuracy"], "example_accuracy": scores["example_accuracy"],
            "answer_loss": scores["loss"], "eval_answers": scores["answers"],
            "final_train_loss": summary["last_loss"], "train_seconds": trained - start,
            "eval_seconds": time.perf_counter() - trained}


def markdown(results: list[dict], settings: list[tuple[int, int]], args, command: str) -> str:
    header = "| mixer | " + " | ".join(f"T={t}, {n} pairs" for t, n in settings) + " |"
    lines = [f"MQAR answer accuracy (argmax, {args.eval_batches * args.batch_size} held-out rows per setting); "
             f"{args.layers} layers ({'mixer + MLP' if args.mlp else 'mixer only'}), d_model {args.d_model}, "
             f"{args.heads} heads, vocabulary {args.vocab}, "
             f"{args.steps} steps of {args.batch_size} rows, lr {args.learning_rate}, seed {args.seed}.", "",
             f"Command: `{command}`", "", header, "|---" * (len(settings) + 1) + "|"]
    for label in dict.fromkeys(r["variant"] for r in results):
        cells = []
        for seq_len, pairs in settings:
            match = [r for r in results if r["variant"] == label and (r["seq_len"], r["num_pairs"]) == (seq_len, pairs)]
            cells.append(f"{match[0]['accuracy']:.3f}" if match else "-")
        lines.append(f"| {LABELS.get(label, label)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixers", default=DEFAULT_MIXERS, help="variants: name or label=mixer;key=value;...")
    parser.add_argument("--settings", default="64:4,64:8", help="seq_len:num_pairs, comma-separated")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--mlp", action=argparse.BooleanOptionalAction, default=False,
                        help="a SwiGLU MLP after every mixer (off: the mixers alone do the recall)")
    parser.add_argument("--vocab", type=int, default=128, help="data.synthetic.vocab_size (= model.vocab_size)")
    parser.add_argument("--queries", type=int, default=16,
                        help="data.synthetic.num_queries per row (at most what fits); 0 = num_pairs")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once, each in its own process")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--schedule", default="constant", help="optim.schedule after warm-up")
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "grid"), help="directory for recall.json and recall.md")
    return parser.parse_args(argv)


def _run_all(args, variants, settings):
    """Yield every run's result in table order; ``--jobs > 1`` trains that many runs at once (spawned processes)."""
    runs = [(args, label, mixer, extra, seq_len, pairs) for seq_len, pairs in settings
            for label, mixer, extra in variants]
    if args.jobs == 1:
        yield from (run_one(*run) for run in runs)
        return
    context = multiprocessing.get_context("spawn")  # JAX does not survive fork
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        yield from pool.map(run_one, *zip(*runs))


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    if args.jobs < 1:
        raise SystemExit(f"error: --jobs must be >= 1, got {args.jobs}")
    variants, settings = parse_variants(args.mixers), parse_settings(args.settings)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = portable(shlex.join(["python", "experiments/recall/run.py", *(sys.argv[1:] if argv is None else argv)]))
    results, start = [], time.perf_counter()
    for result in _run_all(args, variants, settings):
        results.append(result)
        print(f"{result['variant']:>28} T={result['seq_len']:<4} pairs={result['num_pairs']:<3} accuracy "
              f"{result['accuracy']:.3f} (train loss {result['final_train_loss']:.3f}, "
              f"{result['train_seconds']:.0f} s)", flush=True)
        report = {"args": portable(vars(args)), "command": command, "platform": platform.platform(),
                  "wall_seconds": time.perf_counter() - start, "results": results}
        (out / "recall.json").write_text(json.dumps(report, indent=2))
        (out / "recall.md").write_text(markdown(results, settings, args, command))
    print(markdown(results, settings, args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
