"""ablate.py: sweep files refused before any run, and a two-variant sweep end to end with a resumed run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import write_corpus
from seqmodels.runs.portable import portable
from seqmodels.sweeps.runner import is_finished, run_specs
from seqmodels.sweeps.spec import SweepError, load_sweep

ROOT = Path(__file__).resolve().parents[1]


def tiny_sweep(tmp_path: Path, **changes) -> Path:
    corpus = write_corpus(tmp_path / "corpus")
    sweep = {
        "name": "tiny",
        "base": "configs/transformer.yaml",
        "overrides": {"model.d_model": 32, "model.num_heads": 2, "model.max_seq_len": 128,
                      "data.source": "text_files", "data.path": str(corpus / "*.txt"), "data.seq_len": 128,
                      "data.heldout_fraction": 0.2, "train.batch_size": 4, "optim.warmup_steps": 2,
                      "log.every_steps": 1, "log.tensorboard": False, "checkpoint.async_save": False},
        "variants": {"transformer": {"model.mixers": "[attention] * 2"},
                     "swa": {"config": "configs/swa.yaml", "model.mixers": "[swa] * 2", "model.swa.window": 8}},
        "seeds": [0],
        "budget": {"tokens": 5120},
        "eval": {"suites": ["perplexity", "needle"], "points": 2, "batch_size": 2, "max_batches": 2,
                 "needle": {"length": 128, "depths": [0.0, 1.0], "per_depth": 2}},
    }
    for key, value in changes.items():
        target = sweep
        *parents, last = key.split("/")
        for parent in parents:
            target = target[parent]
        target[last] = value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def one_device_env() -> dict:
    """The tests' environment without their 8 simulated devices: each sweep run is one single-threaded CPU process."""
    return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}


def ablate(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "ablate.py", *args], cwd=cwd, capture_output=True, text=True, timeout=1500,
                          env=one_device_env())


@pytest.mark.parametrize("change, message", [
    ({"budgets": 3}, r"unknown key\(s\) 'budgets'"),
    ({"variants/swa/model.swa.windw": 8}, "variant 'swa': .*model.swa.windw"),
    ({"variants/swa/model.d_model": -4}, "variant 'swa': .*model.d_model"),
    ({"variants/transformer/train.steps": 3}, "variant 'transformer': key 'train.steps' is set by ablate.py"),
    ({"variants/swa/config": "configs/nope.yaml"}, "variant 'swa': config: no such file"),
    ({"budget": {"tokens": 1, "flops": 2}}, "budget: give exactly one of tokens or flops"),
    ({"eval/suites": ["perplexity", "bleu"]}, "eval.suites"),
    ({"eval/needle/length": 64}, "variant 'transformer': eval.needle: eval.needle.length=64 cannot hold"),
    ({"variants/swa/seeds": [1, 1]}, "variant 'swa': seeds: must be a list of distinct ints"),
    ({"eval/ruler": {"tasks": ["niah_single_9"]}}, r"eval.ruler.tasks: unknown or no task\(s\) \['niah_single_9'\]"),
    ({"eval/ruler": {"lengths": 1024}}, "eval.ruler.lengths: expected a list"),
    ({"eval/ruler": {"depths": [0.5, 2]}}, r"eval.ruler.depths: must be numbers in \[0, 1\]"),
    ({"eval/ruler": {"per_depth": 0}}, "eval.ruler.per_depth: must be an int >= 1"),
    ({"eval/ruler": {"window": 3}}, r"eval.ruler: unknown key\(s\) 'window'"),
    ({"eval/suites": ["ruler"], "eval/ruler": {"lengths": [4096]}},
     r"variant 'transformer': eval.ruler.lengths \[4096\]: every length exceeds model.max_seq_len=128"),
    ({"variants/swa/time_limit_minutes": -1}, "variant 'swa': time_limit_minutes: must be a number >= 0"),
])
def test_a_bad_sweep_file_is_refused_naming_variant_and_key(tmp_path, change, message):
    path = tiny_sweep(tmp_path, **change)
    with pytest.raises(SweepError, match=message):
        load_sweep(path, ROOT)


def test_ablate_refuses_before_any_run_starts(tmp_path):
    path = tiny_sweep(tmp_path, **{"variants/swa/model.swa.windw": 8})
    result = ablate("--sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "variant 'swa'" in result.stderr and "model.swa.windw" in result.stderr
    assert "nothing was run" in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_budgets_give_steps_and_flops_budgets_equalise_compute(tmp_path):
    sweep = load_sweep(tiny_sweep(tmp_path), ROOT)
    assert [v.steps for v in sweep.variants] == [10, 10]  # 5120 tokens / (4 rows x 128)
    flops = 3 * sweep.variants[0].flops_per_token * 5120
    sweep = load_sweep(tiny_sweep(tmp_path, budget={"flops": flops}), ROOT)
    steps = {v.name: v.steps for v in sweep.variants}
    assert steps["transformer"] == 10
    swa = sweep.variant("swa")
    assert steps["swa"] == round(flops / (3 * swa.flops_per_token * 512)) and swa.flops_per_token < \
        sweep.variant("transformer").flops_per_token and steps["swa"] > 10


def test_a_variant_with_its_own_seeds_and_limit_keeps_them_and_the_others_the_sweeps(tmp_path):
    from seqmodels.sweeps.runner import run_specs
    sweep = load_sweep(tiny_sweep(tmp_path, **{"seeds": [0, 1], "variants/swa/seeds": [3],
                                               "variants/swa/time_limit_minutes": 2}), ROOT)
    runs = [(spec.variant.name, spec.seed) for spec in run_specs(sweep, tmp_path / "runs")]
    assert runs == [("transformer", 0), ("transformer", 1), ("swa", 3)]
    assert not any("seeds" in o or "time_limit" in o for o in sweep.variant("swa").overrides)
    assert sweep.variant("swa").time_limit_minutes == 2 and sweep.variant("transformer").time_limit_minutes is None


def test_every_sweep_file_in_configs_names_known_keys_and_existing_configs():
    from seqmodels.sweeps.spec import _TOP_KEYS
    files = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))
    assert files, "configs/sweeps/ holds no sweep file"
    for path in files:
        # load_sweep needs the corpus and tokenizer the file names (built by the commands in its header)
        sweep = yaml.safe_load(path.read_text())
        assert set(sweep) <= _TOP_KEYS, path
        assert (ROOT / sweep["base"]).is_file(), path
        for name, variant in sweep["variants"].items():
            assert (ROOT / variant.get("config", sweep["base"])).is_file(), (path, name)


def _png_series(path: Path) -> dict:
    from PIL import Image
    return json.loads(Image.open(path).text["Description"])


def test_the_table_shows_each_seeds_loss_interval_and_ruler_scores_only_for_runs_that_have_them():
    from seqmodels.sweeps.report import summarise, table_markdown

    def run(seed, interval=None, ruler=None):
        point = {"tokens": 100, "flops": 1000, "loss": 2.5 + seed / 10}
        if interval:
            point["loss_interval"] = interval
        evaluation = {"curve": [point], "tokens": 100, **({"ruler": ruler} if ruler else {})}
        return {"seed": seed, "status": "done", "eval": evaluation, "speed": {"tokens_per_second": 10.0}}

    ruler = {"tasks": {"niah_single_1": {"by_length": {"512": {"score": 0.5}, "1024": {"score": 0.25}}},
                       "vt": {"by_length": {"512": {"skipped": "needs 1337 tokens"}, "1024": {"score": 1.0}}}}}
    new = [run(0, [2.4, 2.6], ruler), run(1, [2.5, 2.7], ruler)]
    old = [run(0), run(1)]  # evaluated before the held-out sample carried intervals

    def results(*variants):
        return {"sweep": "s", "budget": {"tokens": 100}, "seeds": [0, 1], "time_limit_minutes": 0, "commit": "c",
                "dirty": False, "command": ["python", "ablate.py"],
                "variants": [{"name": name, "parameters": 10, "forward_flops_per_token": 20, "tokens": 100,
                              "runs": runs, "summary": summarise(runs)} for name, runs in variants]}

    table = table_markdown(results(("new", new), ("old", old)))
    assert "val loss 95 % CI per seed" in table and "RULER score" in table
    row = next(line for line in table.splitlines() if line.startswith("| new |"))
    assert "[2.400, 2.600]; [2.500, 2.700]" in row and "niah_single_1 0.38, vt 1.00" in row
    old_row = next(line for line in table.splitlines() if line.startswith("| old |"))
    assert "| 2.550 ± 0.071 | – | – | done |" in old_row
    assert "CI" not in table_markdown(results(("old", old)))  # committed results without intervals: unchanged


def test_loss_curves_average_seeds_only_where_every_seed_has_a_point(tmp_path):
    from seqmodels.sweeps.report import write_plots

    def curve(points):
        return {"eval": {"curve": [{"tokens": t, "flops": 10 * t, "loss": loss} for t, loss in points]}}

    # seed 1 was stopped by the time limit at 25 tokens and evaluated there, then resumed to 30
    runs = [curve([(10, 9.0), (20, 8.0), (30, 7.0)]), curve([(10, 9.5), (20, 8.5), (25, 8.4), (30, 7.5)])]
    results = {"variants": [{"name": "a", "runs": runs, "summary": {}},
                            {"name": "b", "runs": [curve([(5, 9.9), (15, 9.1)])], "summary": {}}]}
    write_plots(results, tmp_path)
    series = _png_series(tmp_path / "loss_vs_tokens.png")
    assert series["a"] == [[10, 9.25], [20, 8.25], [30, 7.25]]
    assert series["b"] == [[5, 9.9], [15, 9.1]]
    assert _png_series(tmp_path / "loss_vs_flops.png")["a"] == [[100, 9.25], [200, 8.25], [300, 7.25]]


@pytest.mark.slow
def test_a_two_variant_sweep_runs_resumes_and_reports(tmp_path):
    path = tiny_sweep(tmp_path)
    runs, results_dir = tmp_path / "runs", tmp_path / "results"
    out = results_dir / "tiny"
    sweep = load_sweep(path, ROOT)
    transformer, swa = run_specs(sweep, runs)
    # An interrupted run: the transformer's own command, stopped (with a checkpoint) at step 4.
    transformer.run_dir.mkdir(parents=True)
    interrupted = subprocess.run([*transformer.train_command, "train.exit_at_step=4"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=600, env=one_device_env())
    assert interrupted.returncode == 0, interrupted.stderr
    assert not is_finished(transformer)

    result = ablate("--sweep", str(path), "--runs-dir", str(runs), "--results-dir", str(results_dir), "--jobs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resuming from step 4 towards step 10" in (transformer.run_dir / "train.log").read_text()
    steps = [json.loads(line)["step"] for line in (transformer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 11))

    results = json.loads((out / "results.json").read_text())
    assert results["commit"] and results["command"][:2] == ["python", "ablate.py"]
    by_name = {v["name"]: v for v in results["variants"]}
    assert list(by_name) == ["transformer", "swa"]
    table = (out / "table.md").read_text()
    for name, variant in by_name.items():
        run, = variant["runs"]
        # Recorded as a reader re-runs it from the repository (no absolute path of this machine).
        assert run["status"] == "done" and run["train_command"] == portable(list(
            transformer.train_command if name == "transformer" else swa.train_command))
        assert not any(part.startswith("/") for part in run["train_command"] + run["eval_command"])
        curve = run["eval"]["curve"]
        evaluated = [4, 5, 10] if name == "transformer" else [5, 10]  # + the interrupted run's checkpoint at step 4
        assert [p["step"] for p in curve] == evaluated and [p["tokens"] for p in curve] == [512 * s for s in evaluated]
        assert variant["summary"]["loss_mean"] == curve[-1]["loss"] < 6.0  # below a uniform guess over 258 bytes
        assert f"| {name} |" in table and f"{curve[-1]['loss']:.3f}" in table
        low, high = curve[-1]["loss_interval"]  # over the documents of the held-out sample
        assert low <= curve[-1]["loss"] <= high and f"[{low:.3f}, {high:.3f}]" in table
        tokens_series = _png_series(out / "loss_vs_tokens.png")[name]
        assert tokens_series == [[p["tokens"], p["loss"]] for p in curve]
        flops_series = _png_series(out / "loss_vs_flops.png")[name]
        assert flops_series == [[p["flops"], p["loss"]] for p in curve]
        assert [y for _, y in _png_series(out / "loss_by_position.png")[name]] == \
            [b["loss"] for b in run["eval"]["perplexity"]["by_position"]]
        needle = run["eval"]["needle"]
        assert needle["examples"] == 4 and set(needle["by_depth"]) == {"0.0", "1.0"}
        assert _png_series(out / "needle_by_depth.png")[name] == [[float(d), a] for d, a in needle["by_depth"].items()]

    log_lines = len((swa.run_dir / "train.log").read_text().splitlines())
    again = ablate("--sweep", str(path), "--runs-dir", str(runs), "--results-dir", str(results_dir))
    assert again.returncode == 0 and "2 of 2 runs already done, skipped" in again.stdout
    assert len((swa.run_dir / "train.log").read_text().splitlines()) == log_lines


@pytest.mark.slow
def test_a_failed_run_is_reported_and_does_not_stop_the_others(tmp_path):
    from seqmodels.training.run_dir import RunDirLock

    path = tiny_sweep(tmp_path, **{"budget": {"tokens": 1024}})
    runs, results_dir = tmp_path / "runs", tmp_path / "results"
    out = results_dir / "tiny"
    transformer, _ = run_specs(load_sweep(path, ROOT), runs)
    with RunDirLock(transformer.run_dir, message=lambda text: None):  # another live run owns this directory
        result = ablate("--sweep", str(path), "--runs-dir", str(runs), "--results-dir", str(results_dir), "--jobs", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "transformer/seed0: failed: train.py exited 2: error:" in result.stdout
    results = json.loads((out / "results.json").read_text())
    failed, done = (v["runs"][0] for v in results["variants"])
    assert failed["status"] == "failed" and "is in use by another run" in failed["error"]
    assert done["status"] == "done" and "eval" in done
    row = next(line for line in (out / "table.md").read_text().splitlines() if line.startswith("| transformer |"))
    assert "seed 0: failed" in row and "is in use by another run" in row
    assert ablate("--sweep", str(path), "--only", "nope", "--runs-dir", str(runs)).returncode == 2
