"""README tables of the memory experiments: the memory sweep, needle, recall and the RULER sweep (AHN: readme_ahn.py)."""

from __future__ import annotations

import re

from readme_format import compact_table, load_json, si


def _layers(overrides: list[str]) -> int | None:
    for override in overrides:
        match = re.fullmatch(r"model\.mixers=\[\w+\] \* (\d+)", override)
        if match:
            return int(match.group(1))
    return None


# What a variant's name does not say (descriptions, not numbers).
MEMORY_DESCRIPTIONS = {"transformer": "Transformer++", "swa_sinks": "window 128, 4 sinks"}


def memory_sweep() -> str:
    """results/sweeps/memory/results.json: per variant its parameters, forward FLOPs per token, the
    summary's tokens/s (``≥`` where the rate includes compilation), each seed's last evaluated loss (or
    the time-limited run's partial loss) and the summary's mean ± std."""
    results = load_json("results/sweeps/memory/results.json")
    common_layers = _layers(results["variants"][0]["overrides"])
    lines = ["| variant | params | fwd FLOPs/token | tokens/s (mixed loads) | val loss, seed 0 / seed 1 | mean ± std |",
             "|---|---|---|---|---|---|"]
    for variant in results["variants"]:
        summary, notes = variant["summary"], []
        if variant["name"] in MEMORY_DESCRIPTIONS:
            notes.append(MEMORY_DESCRIPTIONS[variant["name"]])
        layers = _layers(variant["overrides"])
        if layers is not None and layers != common_layers:
            notes.append(f"{layers} layers")
        if variant["seeds"] != results["seeds"]:
            notes.append(f"{len(variant['seeds'])} seed" + "s" * (len(variant["seeds"]) != 1))
        if variant["time_limit_minutes"] != results["time_limit_minutes"]:
            notes.append(f"{variant['time_limit_minutes']:g} min")
        name = variant["name"] + (f" ({', '.join(notes)})" if notes else "")
        speed = summary["tokens_per_second"]
        speed_text = ("≥" if summary["speed_includes_compilation"] else "") + f"{speed:,.0f}"
        if summary["loss_mean"] is not None:
            seeds = [run["eval"]["curve"][-1]["loss"] for run in variant["runs"]]
            loss_text = " / ".join(f"{loss:.3f}" for loss in seeds)
            mean_text = f"{summary['loss_mean']:.3f} ± {summary['loss_std']:.3f}"
        elif summary["partial_losses"]:
            loss_text = "(" + ", ".join(f"{loss:.3f} at {si(tokens)} tokens" for tokens, loss in
                                        summary["partial_losses"]) + ")"
            mean_text = ""
        else:
            loss_text, mean_text = "not evaluated within the limit", ""
        lines.append(f"| {name} | {si(variant['parameters'])} | {si(variant['forward_flops_per_token'])} | "
                     f"{speed_text} | {loss_text} | {mean_text} |")
    return "\n".join(lines)


NEEDLE = "experiments/needle/results"
# The rows of each table of experiments/needle/README.md: (label, results file under NEEDLE, model).
NEEDLE_ETA_SWEEP = [("[0, 0.05]", "eta_sweep/eta_0.05/needle.json", "atlas"),
                    ("[0, 0.1]", "eta_sweep/eta_0.1/needle.json", "atlas"),
                    ("[0, 0.2]", "eta_sweep/eta_0.2/needle.json", "atlas"),
                    ("eta on the gradient, [0, 0.05] (table below)", "needle.json", "atlas")]
NEEDLE_CORRECTED = [("atlas (corrected defaults)", "corrected/needle.json", "atlas")]
NEEDLE_ABLATIONS = [("atlas (the row above)", "corrected/needle.json", "atlas"),
                    ("omeganet: `ns_steps` 5 -> 0", "corrected/needle.json", "omeganet"),
                    ("`ablations/atlas_degree1`: `poly_degree` 2 -> 1", "corrected/needle.json", "ablations/atlas_degree1"),
                    ("`ablations/atlas_window1`: `window` 8 -> 1", "corrected/needle.json", "ablations/atlas_window1"),
                    ("`ablations/atlas_linear`: `memory_depth` 2 -> 1", "corrected/needle.json", "ablations/atlas_linear"),
                    ("titans (window 1, degree 1, no NS, eta [0, 0.5])", "corrected/needle.json", "titans")]
NEEDLE_ETA_CURRENT = [("[0, 0.02]", "eta_sweep_current/eta_0.02/needle.json", "atlas"),
                      ("[0, 0.05] (`corrected/`, the default, commit 69af667)", "corrected/needle.json", "atlas"),
                      ("[0, 0.05] (`eta_0.05`, commit cbd0c80)", "eta_sweep_current/eta_0.05/needle.json", "atlas"),
                      ("[0, 0.1]", "eta_sweep_current/eta_0.1/needle.json", "atlas"),
                      ("[0, 0.2]", "eta_sweep_current/eta_0.2/needle.json", "atlas")]
NEEDLE_BEFORE = [(model, "needle.json", model) for model in ("transformer", "titans", "atlas", "omeganet")]


def _needle(first: str, rows: list[tuple[str, str, str]]) -> str:
    """Per row the model's retrieval accuracy at each evaluated length, its last training loss and its
    training seconds, as ``needle.json`` records them."""
    lines, lengths = [], None
    for label, path, model in rows:
        report = load_json(f"{NEEDLE}/{path}")
        if lengths is None:
            lengths = report["lengths"]
        assert report["lengths"] == lengths, (path, report["lengths"], lengths)
        result = report["models"][model]
        lines.append([label, *(f"{result['by_length'][name]['accuracy']:.2f}" for name in lengths),
                      f"{result['last_loss']:.3f}", f"{result['train_seconds']:.0f}"])
    header = [first, *(f"{name} ({tokens} tokens)" for name, tokens in lengths.items()), "final train loss", "train s"]
    return "\n".join("|" + "|".join(f" {cell} " for cell in cells) + "|"
                     for cells in [header, ["---"] * len(header), *lines]).replace("| --- ", "|---")


# (label, results directory under NEEDLE / RECALL without its _seed<S> suffix): ns_granularity at 2 seeds
GRANULARITY = [("token (the paper's Eq. 32), 250 steps", "granularity/token"),
               ("chunk, 250 steps", "granularity/chunk"),
               ("chunk, 1,250 steps (in less than token's time)", "granularity/chunk_1250steps")]
GRANULARITY_SEEDS = (0, 1)


def _seeds(values: list[float], digits: int) -> str:
    """``mean (seed 0 / seed 1)``."""
    return f"{sum(values) / len(values):.{digits}f} ({' / '.join(f'{v:.{digits}f}' for v in values)})"


def needle_granularity() -> str:
    """experiments/needle/results/granularity/<run>_seed<S>/needle.json: per length the mean accuracy over the
    seeds (each seed's in brackets), the final training loss and the training seconds, both means."""
    rows, lengths = [], None
    for label, run in GRANULARITY:
        results = []
        for seed in GRANULARITY_SEEDS:
            report = load_json(f"{NEEDLE}/{run}_seed{seed}/needle.json")
            assert report["settings"]["seed"] == seed, (run, report["settings"]["seed"])
            lengths = lengths or report["lengths"]
            assert report["lengths"] == lengths, (run, report["lengths"], lengths)
            results.append(report["models"]["atlas"])
        rows.append([label, *(_seeds([r["by_length"][name]["accuracy"] for r in results], 2) for name in lengths),
                     _seeds([r["last_loss"] for r in results], 3),
                     f"{sum(r['train_seconds'] for r in results) / len(results):.0f}"])
    header = ["ns_granularity", *(f"{name} ({tokens} tokens)" for name, tokens in lengths.items()),
              "final train loss", "train s"]
    return compact_table(header, rows, 1)


def needle_eta_sweep() -> str:
    """experiments/needle/results/eta_sweep/eta_<high>/needle.json and results/needle.json (eta on the gradient)."""
    return _needle("eta_range", NEEDLE_ETA_SWEEP)


def needle_corrected() -> str:
    """experiments/needle/results/corrected/needle.json: the Atlas row."""
    return _needle("model", NEEDLE_CORRECTED)


def needle_ablations() -> str:
    """experiments/needle/results/corrected/needle.json: Atlas, its one-knob ablations and Titans."""
    return _needle("model (one knob from Atlas)", NEEDLE_ABLATIONS)


def needle_eta_current() -> str:
    """experiments/needle/results/eta_sweep_current/eta_<high>/needle.json and corrected/needle.json."""
    return _needle("eta_range", NEEDLE_ETA_CURRENT)


def needle_before() -> str:
    """experiments/needle/results/needle.json: the models before the defaults followed the paper."""
    return _needle("model", NEEDLE_BEFORE)


RECALL = "experiments/recall/results"


def _recall(run: str, variant: str, pairs: int = 4) -> dict:
    """The result of ``variant`` with ``pairs`` key-value pairs in ``RECALL/<run>/recall.json``."""
    report = load_json(f"{RECALL}/{run}/recall.json")
    (result,) = [r for r in report["results"] if r["variant"] == variant and r["num_pairs"] == pairs]
    return result


def _accuracy(run: str, variant: str, pairs: int = 4) -> str:
    return f"{_recall(run, variant, pairs)['accuracy']:.3f}"


def _recall_trained(run: str, variant: str) -> list[str]:
    """4-pair accuracy, final training loss, training seconds."""
    result = _recall(run, variant)
    return [f"{result['accuracy']:.3f}", f"{result['final_train_loss']:.2f}", f"{result['train_seconds']:.0f}"]


RECALL_GRID = [("Transformer++ (attention)", "attention"), ("attention + short conv on q, k, v (K=4)", "attention+conv"),
               *((name, name) for name in ("mamba2", "deltanet", "gated_deltanet", "muonssm_mamba2",
                                           "muonssm_gated_deltanet"))]
RECALL_ATLAS = [("attention + short conv (K=4)", "attention+conv"), ("gated_deltanet", "gated_deltanet"),
                ("atlas", "atlas"), ("titans", "titans"), ("omeganet (ns_steps 0)", "omeganet (atlas ns_steps 0)"),
                ("atlas window 1", "atlas window 1"), ("atlas poly_degree 1", "atlas poly_degree 1"),
                ("atlas linear memory", "atlas linear memory")]
RECALL_CORRECTED = ["mamba2", "muonssm_mamba2", "longhorn", "muonssm_longhorn", "muonssm_gated_deltanet"]
RECALL_UPDATE = ["atlas", "atlas window 1", "atlas poly_degree 1", "atlas linear memory"]
RECALL_ETA = ["0.02", "0.05", "0.1", "0.2"]


def recall_grid() -> str:
    """experiments/recall/results/grid/recall.json: answer accuracy per mixer with 4 and 8 pairs."""
    rows = [[label, _accuracy("grid", variant, 4), _accuracy("grid", variant, 8)] for label, variant in RECALL_GRID]
    return compact_table(["mixer", "T=64, 4 pairs", "T=64, 8 pairs"], rows)


def recall_atlas() -> str:
    """experiments/recall/results/atlas/recall.json: 4-pair accuracy, final training loss, training seconds."""
    return compact_table(["mixer", "T=64, 4 pairs", "final train loss", "train s"],
                    [[label, *_recall_trained("atlas", variant)] for label, variant in RECALL_ATLAS], 1)


def recall_grid_corrected() -> str:
    """experiments/recall/results/grid_corrected/recall.json, and grid/recall.json for the mixers it has."""
    grid = {r["variant"] for r in load_json(f"{RECALL}/grid/recall.json")["results"]}
    rows = [[name, _accuracy("grid_corrected", name, 4), _accuracy("grid_corrected", name, 8),
             f"{_accuracy('grid', name, 4)} / {_accuracy('grid', name, 8)}" if name in grid else "(new mixer)"]
            for name in RECALL_CORRECTED]
    return compact_table(["mixer", "T=64, 4 pairs", "T=64, 8 pairs", "before (`results/grid/`, 4 / 8 pairs)"], rows)


def recall_ns_scope() -> str:
    """experiments/recall/results/ns_scope/recall.json (both scopes) and grid/recall.json (the per-head rule)."""
    name = "muonssm_gated_deltanet"
    rows = [[f"{name}, `ns_scope: {scope}`" + " (default)" * (scope == "all"),
             *(_accuracy("ns_scope", f"{name} ns_scope {scope}", pairs) for pairs in (4, 8))] for scope in ("all", "head")]
    rows.append(["(`results/grid/`, before `ns_scope` existed: the per-head rule)",
                 *(_accuracy("grid", name, pairs) for pairs in (4, 8))])
    return compact_table(["mixer", "T=64, 4 pairs", "T=64, 8 pairs"], rows)


def recall_atlas_update() -> str:
    """experiments/recall/results/atlas_update/recall.json, against atlas/recall.json (eta on the gradient);
    the ``ns_steps: 0`` rows are atlas/recall.json's."""
    rows = [[name, *_recall_trained("atlas_update", name), _accuracy("atlas", name)] for name in RECALL_UPDATE]
    for label, variant in (("omeganet (ns_steps 0; `results/atlas/`, unchanged rule)", "omeganet (atlas ns_steps 0)"),
                           ("titans (`results/atlas/`, unchanged rule)", "titans")):
        rows.append([label, *_recall_trained("atlas", variant), _accuracy("atlas", variant)])
    return compact_table(["mixer", "T=64, 4 pairs", "final train loss", "train s", "before (eta on the gradient)"], rows, 1)


def recall_atlas_corrected() -> str:
    """experiments/recall/results/atlas_corrected/recall.json and atlas_corrected_rest/recall.json, against
    atlas_update/recall.json (OmegaNet: atlas/recall.json)."""
    rows = [[name, *_recall_trained("atlas_corrected", name), _accuracy("atlas_update", name)]
            for name in ("atlas", "atlas poly_degree 1")]
    rows.append(["atlas linear memory", *_recall_trained("atlas_corrected_rest", "atlas linear memory"),
                 _accuracy("atlas_update", "atlas linear memory")])
    rows.append(["omeganet (ns_steps 0)", *_recall_trained("atlas_corrected_rest", "omeganet (ns_steps 0)"),
                 f"{_accuracy('atlas', 'omeganet (atlas ns_steps 0)')} (`results/atlas/`)"])
    rows.append(["atlas window 1", *_recall_trained("atlas_corrected_rest", "atlas window 1"),
                 _accuracy("atlas_update", "atlas window 1")])
    return compact_table(["mixer", "T=64, 4 pairs", "final train loss", "train s",
                     "`results/atlas_update/` (eta [0, 0.1], earlier window form)"], rows, 1)


def recall_granularity() -> str:
    """experiments/recall/results/granularity/<run>_seed<S>/recall.json: accuracy, held-out answer loss and
    final training loss as means over the seeds (each seed's in brackets), training seconds (mean)."""
    rows = []
    for label, run in GRANULARITY:
        results = []
        for seed in GRANULARITY_SEEDS:
            report = load_json(f"{RECALL}/{run}_seed{seed}/recall.json")
            assert report["args"]["seed"] == seed, (run, report["args"]["seed"])
            (result,) = report["results"]
            results.append(result)
        rows.append([label, _seeds([r["accuracy"] for r in results], 3), _seeds([r["answer_loss"] for r in results], 2),
                     _seeds([r["final_train_loss"] for r in results], 2),
                     f"{sum(r['train_seconds'] for r in results) / len(results):.0f}"])
    return compact_table(["ns_granularity", "T=64, 4 pairs", "held-out answer loss", "final train loss", "train s"],
                         rows, 1)


def recall_eta() -> str:
    """experiments/recall/results/eta_current/eta_<high>/recall.json (one run each, so its wall seconds are
    the run's) and, for 0.05, atlas_corrected/recall.json's Atlas row (a run of two variants: no wall s)."""
    rows = []
    for high in RECALL_ETA:
        if high == "0.05":
            result, label, wall = _recall("atlas_corrected", "atlas"), "[0, 0.05] (`results/atlas_corrected/`, the default)", ""
        else:
            report = load_json(f"{RECALL}/eta_current/eta_{high}/recall.json")
            (result,) = report["results"]
            label, wall = f"[0, {high}]", f"{report['wall_seconds']:.0f}"
            assert result["variant"] == f"atlas eta [0, {high}]", result["variant"]
        rows.append([label, f"{result['accuracy']:.3f}", f"{result['final_train_loss']:.2f}",
                     f"{result['answer_loss']:.2f}", f"{result['train_seconds']:.0f}", wall])
    return compact_table(["eta_range", "T=64, 4 pairs", "final train loss", "held-out answer loss", "train s", "wall s"],
                    rows, 1)


RULER_SWEEP = "experiments/ruler/results/ruler/results.json"
RULER_TASK_BPE = "experiments/ruler/results/ruler_task_bpe/results.json"


def ruler_sweep(results_file: str = RULER_SWEEP) -> str:
    """A RULER sweep's report (``experiments/ruler/results/NAME/results.json``; default the first sweep's): the score
    table of ``experiments/ruler/run.py`` (per variant, task and length), as that script writes it to ``ruler.md``
    beside the report."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "experiments" / "ruler" / "run.py"
    spec = importlib.util.spec_from_file_location("experiments_ruler_run", path)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    results = load_json(results_file)
    return "\n".join(line for line in run.markdown(results, run.train_length(results)).splitlines()
                     if line.startswith("|"))


def ruler_task_bpe() -> str:
    """experiments/ruler/results/ruler_task_bpe/results.json: the second RULER sweep's score table
    (``configs/sweeps/ruler_task_bpe.yaml``), as ``ruler_sweep`` makes the first's."""
    return ruler_sweep(RULER_TASK_BPE)
