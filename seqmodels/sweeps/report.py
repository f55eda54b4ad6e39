"""A sweep's report: ``results.json``, ``table.md`` and plots under ``results/sweeps/NAME/``.

``results.json`` holds everything: the sweep file, the commit (and whether the tree had changes),
the ablate command, budget, seeds, eval settings, and per variant its config, overrides, steps,
parameters, forward FLOPs per token and each run (status, error, exact commands, wall time, the
evaluation: loss curve, loss by position, recall / needle accuracy, tokens/s).

``table.md``: one row per variant: parameters, forward FLOPs per token, tokens/s (median over its
runs' logged steps) and its ratio to the first variant's, tokens trained, validation loss mean ±
std over the seeds that finished (std over one seed is not shown; a time-limited run's loss at the
tokens it reached in parentheses), each finished seed's 95 % bootstrap interval of that loss over held-out
documents (runs evaluated before the held-out sample carried one have none, and the column is left out when no
run has one), needle / recall accuracy, the mean RULER score per task, and the status (a failed run's error, a time-limited run's
step). A variant none of whose runs was evaluated shows its error only. Below it, the final loss per
position bucket of every evaluated variant.

Plots (matplotlib, Agg): ``loss_vs_tokens.png``, ``loss_vs_flops.png`` (validation loss at each
evaluated checkpoint, mean over seeds), ``loss_by_position.png`` (final loss per position bucket),
``needle_by_depth.png`` (final needle accuracy per depth, when the suite ran). Each PNG carries the
points it plots, ``{variant: [[x, y], ...]}`` as JSON, in its ``Description`` text chunk.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from seqmodels.runs.portable import portable
from seqmodels.sweeps.evaluate import training_speed
from seqmodels.sweeps.runner import RunSpec, read_status

PLOTS = ("loss_vs_tokens.png", "loss_vs_flops.png", "loss_by_position.png", "needle_by_depth.png")


def git_commit(root: Path) -> dict:
    def git(*args):
        result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return result.stdout.strip() if result.returncode == 0 else None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def _run_record(spec: RunSpec) -> dict:
    status = read_status(spec) or {"status": "not run", "train_command": list(spec.train_command),
                                   "eval_command": list(spec.eval_command)}
    record = {"seed": spec.seed, "run_dir": str(spec.run_dir), **status}
    if (spec.run_dir / "metrics.jsonl").is_file():
        record["speed"] = training_speed(spec.run_dir)  # also for a run whose evaluation failed
    evaluation = spec.run_dir / "sweep_eval.json"
    if status.get("status") in ("done", "time_limit") and evaluation.is_file():
        record["eval"] = json.loads(evaluation.read_text())
    return record


def _mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarise(runs: list[dict]) -> dict:
    evaluated = [r["eval"] for r in runs if "eval" in r]
    finished = [r["eval"] for r in runs if "eval" in r and r["status"] == "done"]
    loss_mean, loss_std = _mean_std([e["curve"][-1]["loss"] for e in finished])
    speed = [r["speed"]["tokens_per_second"] for r in runs if r.get("speed", {}).get("tokens_per_second")]
    summary = {"loss_mean": loss_mean, "loss_std": loss_std, "seeds_finished": len(finished),
               "tokens_per_second": statistics.median(speed) if speed else None,
               "speed_includes_compilation": any(r.get("speed", {}).get("includes_compilation") for r in runs),
               "tokens_trained": [e["tokens"] for e in evaluated],
               "steps_trained": [r["speed"].get("last_step") for r in runs if "speed" in r],
               "partial_losses": [[e["tokens"], e["curve"][-1]["loss"]] for r, e in
                                  ((r, r["eval"]) for r in runs if "eval" in r) if r["status"] != "done"],
               "statuses": [r["status"] for r in runs],
               "errors": [r.get("error") for r in runs if r.get("error")]}
    if evaluated and all("perplexity" in e for e in evaluated):
        buckets = [b["positions"] for b in evaluated[0]["perplexity"]["by_position"]]
        summary["loss_by_position"] = [
            {"positions": bucket, "loss": _mean_std([e["perplexity"]["by_position"][i]["loss"] for e in evaluated])[0]}
            for i, bucket in enumerate(buckets)]
    if evaluated and all("needle" in e for e in evaluated):
        summary["needle_accuracy"] = _mean_std([e["needle"]["accuracy"] for e in evaluated])[0]
        depths = list(evaluated[0]["needle"]["by_depth"])
        summary["needle_by_depth"] = {d: _mean_std([e["needle"]["by_depth"][d] for e in evaluated])[0] for d in depths}
    intervals = [e["curve"][-1]["loss_interval"] for e in finished if "loss_interval" in e["curve"][-1]]
    if intervals:  # runs evaluated before the held-out sample carried intervals have none
        summary["loss_intervals"] = intervals
    if evaluated and all("ruler" in e for e in evaluated):
        summary["ruler_scores"] = {
            task: _mean_std([cell["score"] for e in evaluated
                             for cell in e["ruler"]["tasks"][task]["by_length"].values() if "score" in cell])[0]
            for task in evaluated[0]["ruler"]["tasks"]}
    if evaluated and all("recall" in e for e in evaluated):
        summary["recall_accuracy"] = {task: _mean_std([e["recall"][task]["accuracy"] for e in evaluated])[0]
                                      for task in evaluated[0]["recall"]}
    return summary


def collect(sweep, specs: list[RunSpec], command: list[str], root: Path) -> dict:
    """The ``results.json`` document of ``sweep`` from its runs' status and evaluation files."""
    variants = []
    for variant in sweep.variants:
        runs = [_run_record(s) for s in specs if s.variant.name == variant.name]
        variants.append({"name": variant.name, "config": variant.config_path, "overrides": list(variant.overrides),
                         "steps": variant.steps, "tokens": variant.steps * variant.config.train.batch_size
                         * variant.config.data.seq_len, "parameters": variant.parameters,
                         "forward_flops_per_token": variant.flops_per_token, "seeds": list(variant.seeds or sweep.seeds),
                         "time_limit_minutes": sweep.time_limit_minutes if variant.time_limit_minutes is None
                         else variant.time_limit_minutes,
                         "runs": runs, "summary": summarise(runs)})
    document = {"sweep": sweep.name, "file": sweep.path, **git_commit(root), "command": command,
                "budget": sweep.budget, "seeds": list(sweep.seeds), "time_limit_minutes": sweep.time_limit_minutes,
                "eval": _plain(sweep.eval), "variants": variants}
    return portable(document)  # a committed results file names no path of this machine


def _plain(value):
    import dataclasses
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _number(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def _shorten(text: str, limit: int = 320) -> str:
    """The end of a long error (where train.py's last words are), marked as cut."""
    return text if len(text) <= limit else "…" + text[-limit:]


def table_markdown(results: dict) -> str:
    variants = results["variants"]
    baseline = next((v["summary"]["tokens_per_second"] for v in variants if v["summary"]["tokens_per_second"]), None)
    has_needle = any("needle_accuracy" in v["summary"] for v in variants)
    has_recall = any("recall_accuracy" in v["summary"] for v in variants)
    has_intervals = any("loss_intervals" in v["summary"] for v in variants)
    has_ruler = any("ruler_scores" in v["summary"] for v in variants)
    header = ["variant", "params", "FLOPs/token (fwd)", "tokens/s", "× first", "tokens trained",
              "val loss (mean ± std)"]
    header += ["val loss 95 % CI per seed"] * has_intervals
    header += ["needle acc"] * has_needle + ["recall acc"] * has_recall + ["RULER score"] * has_ruler + ["status"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant in variants:
        summary = variant["summary"]
        speed = summary["tokens_per_second"]
        loss = summary["loss_mean"]
        loss_text = "–" if loss is None else _number(loss) + (f" ± {summary['loss_std']:.3f}" if summary["loss_std"]
                                                               is not None else "")
        if loss is None and summary["partial_losses"]:  # time-limited: its loss at fewer tokens, not comparable
            loss_text = "(" + ", ".join(f"{value:.3f} at {_si(tokens)}" for tokens, value in
                                        summary["partial_losses"]) + ")"
        trained = ", ".join(_si(t) for t in summary["tokens_trained"]) or "–"
        row = [variant["name"], _si(variant["parameters"]), _si(variant["forward_flops_per_token"]),
               ("≥" if summary["speed_includes_compilation"] else "") + _number(speed, 0),
               ("≥" if summary["speed_includes_compilation"] else "")
               + _number(speed / baseline if speed and baseline else None, 2),
               f"{trained} of {_si(variant['tokens'])}", loss_text]
        if has_intervals:
            row.append("; ".join(f"[{low:.3f}, {high:.3f}]" for low, high in summary.get("loss_intervals", []))
                       or "–")
        if has_needle:
            row.append(_number(summary.get("needle_accuracy"), 2))
        if has_recall:
            recall = summary.get("recall_accuracy")
            row.append(", ".join(f"{t} {a:.2f}" for t, a in recall.items()) if recall else "–")
        if has_ruler:
            ruler = summary.get("ruler_scores")
            row.append(", ".join(f"{t} {_number(a, 2)}" for t, a in ruler.items()) if ruler else "–")
        statuses = summary["statuses"]
        note = ", ".join(f"seed {r['seed']}: {r['status']}" for r in variant["runs"]) if set(statuses) != {"done"} \
            else "done"
        if variant.get("seeds", results["seeds"]) != results["seeds"]:
            note = f"seeds {variant['seeds']} (its own); {note}"
        if variant.get("time_limit_minutes", results["time_limit_minutes"]) != results["time_limit_minutes"]:
            note = f"time limit {variant['time_limit_minutes']:g} min (its own); {note}"
        if summary["errors"]:
            note += " — " + "; ".join(_shorten(e.replace("|", "/")) for e in summary["errors"])
        lines.append("| " + " | ".join([*row, note]) + " |")
    budget = ", ".join(f"{k} {v:g}" for k, v in results["budget"].items())
    return (f"# Sweep `{results['sweep']}`\n\nBudget per run: {budget}; seeds {results['seeds']}; commit "
            f"`{results['commit']}`{' (with uncommitted changes)' if results['dirty'] else ''}.\n\n"
            f"Command: `{' '.join(results['command'])}`\n\n" + "\n".join(lines) + "\n\n"
            + position_table(variants) + "\n"
            "tokens/s: median over the logged training steps (the first, compiling, left out), same machine, "
            "same sweep; ≥: only the first logged steps ran, so the rate includes the compilation and the steady "
            "rate is higher; `× first` is the ratio to the first variant's. val loss: nats per token on the "
            "held-out documents at the last step, over the seeds that trained to the budget; in parentheses, "
            "the loss of a run stopped by the time limit at the tokens it reached (not comparable). "
            "[a, b): loss of the tokens at positions a..b-1 of their document (mean over the evaluated seeds).\n"
            + ("val loss 95 % CI: per finished seed, a percentile bootstrap over the documents of the held-out "
               "sample (seqmodels.data.heldout_sample); – for runs evaluated before the sample carried one.\n"
               if has_intervals else "")
            + ("RULER score: per task, the fraction of references found in the greedy continuation, mean over "
               "the evaluated seeds and eval.ruler.lengths (per length, depth and interval: results.json).\n"
               if has_ruler else ""))


def position_table(variants: list[dict]) -> str:
    """Final validation loss per position bucket, one row per evaluated variant ("" when none was)."""
    rows = [(v["name"], v["summary"]["loss_by_position"]) for v in variants if v["summary"].get("loss_by_position")]
    if not rows:
        return ""
    buckets = [tuple(b["positions"]) for b in rows[0][1]]
    lines = ["| variant | " + " | ".join(f"[{a}, {b})" for a, b in buckets) + " |", "|" + "---|" * (len(buckets) + 1)]
    for name, by_position in rows:
        lines.append(f"| {name} | " + " | ".join(_number(b["loss"]) for b in by_position) + " |")
    return "Loss by position in the document:\n\n" + "\n".join(lines) + "\n"


def _save(figure, path: Path, series: dict) -> None:
    """Save the figure with its plotted points as JSON in the PNG's ``Description`` text chunk."""
    import matplotlib.pyplot as plt
    figure.savefig(path, dpi=120, metadata={"Description": json.dumps(series)})
    plt.close(figure)


def _legend(plot) -> None:
    if plot.get_legend_handles_labels()[0]:
        plot.legend(fontsize=7, ncol=2)
    else:
        plot.text(0.5, 0.5, "no evaluated run", ha="center", va="center", transform=plot.transAxes)


def write_plots(results: dict, out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 20 distinct colours: a sweep may have more variants than the default cycle's 10
    plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.get_cmap("tab20").colors)
    written = []
    for axis, name, label in (("tokens", "loss_vs_tokens.png", "training tokens"),
                              ("flops", "loss_vs_flops.png", "training FLOPs")):
        figure, plot, series = *plt.subplots(figsize=(7, 4.5)), {}
        for variant in results["variants"]:
            curves = [r["eval"]["curve"] for r in variant["runs"] if "eval" in r]
            if not curves:
                continue
            # only the points every seed reached: a mean over the seeds that happen to have a point (a run
            # the time limit stopped, then resumed, has one more) would zigzag between seeds
            points = sorted(set.intersection(*({p[axis] for p in c} for c in curves)))
            if not points:
                continue
            means = [statistics.fmean(p["loss"] for c in curves for p in c if p[axis] == x) for x in points]
            plot.plot(points, means, marker="o", label=variant["name"])
            series[variant["name"]] = [[x, y] for x, y in zip(points, means)]
        plot.set_xlabel(label)
        plot.set_ylabel("validation loss (nats/token)")
        plot.set_xscale("log")
        plot.grid(alpha=0.3)
        _legend(plot)
        figure.tight_layout()
        _save(figure, out / name, series)
        written.append(name)
    figure, plot, series = *plt.subplots(figsize=(7, 4.5)), {}
    for variant in results["variants"]:
        buckets = variant["summary"].get("loss_by_position")
        if buckets:
            points = [(b["positions"][0] + max(b["positions"][1] - 1, b["positions"][0])) / 2 + 1 for b in buckets]
            plot.plot(points, [b["loss"] for b in buckets], marker=".", label=variant["name"])
            series[variant["name"]] = [[x, b["loss"]] for x, b in zip(points, buckets)]
    plot.set_xscale("log")
    plot.set_xlabel("position in document (bucket centre, +1)")
    plot.set_ylabel("validation loss (nats/token)")
    plot.grid(alpha=0.3)
    _legend(plot)
    figure.tight_layout()
    _save(figure, out / "loss_by_position.png", series)
    written.append("loss_by_position.png")
    needles = [(v["name"], v["summary"]["needle_by_depth"]) for v in results["variants"]
               if "needle_by_depth" in v["summary"]]
    if needles:
        figure, plot = plt.subplots(figsize=(7, 4.5))
        for name, by_depth in needles:
            plot.plot([float(d) for d in by_depth], list(by_depth.values()), marker="o", label=name)
        series = {name: [[float(d), a] for d, a in by_depth.items()] for name, by_depth in needles}
        plot.set_xlabel("needle depth (fraction of the haystack)")
        plot.set_ylabel("retrieval accuracy")
        plot.set_ylim(-0.05, 1.05)
        plot.grid(alpha=0.3)
        _legend(plot)
        figure.tight_layout()
        _save(figure, out / "needle_by_depth.png", series)
        written.append("needle_by_depth.png")
    return written


def write_report(results: dict, out: Path) -> list[str]:
    """Write ``results.json``, ``table.md`` and the plots into ``out``; return the file names."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "table.md").write_text(table_markdown(results))
    return ["results.json", "table.md", *write_plots(results, out)]
