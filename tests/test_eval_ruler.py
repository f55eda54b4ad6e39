"""eval.py --suites ruler on a tiny trained run: JSON, the task x length table, a heatmap per task."""

import json

import pytest

import eval as eval_entry
import train as train_entry
from conftest import tiny_overrides, write_corpus


pytestmark = pytest.mark.xdist_group("ruler")  # one worker builds the module's trained run once
STEPS_TO_LEARN = 800


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ruler")
    corpus = str(write_corpus(root / "corpus") / "*.txt")
    run_dir = root / "run"
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=2, model__max_seq_len=512,
                                           checkpoint__every_steps=2)) == 0
    return run_dir


def test_eval_ruler_writes_scores_a_table_and_heatmaps_and_leaves_out_lengths_beyond_the_model(trained_run, capsys):
    out = trained_run / "ruler" / "eval.json"
    assert eval_entry.main(["--run", str(trained_run), "--suites", "ruler", "--lengths", "512,1024",
                            "--ruler-tasks", "niah_single_1,fwe", "--ruler-depths", "0,1", "--ruler-examples", "1",
                            "--batch-size", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "ruler: length 1024 left out: exceeds model.max_seq_len=512" in err
    assert "ruler: niah_single_1 at 512 tokens: " in err and "ruler: fwe at 512 tokens: " in err  # progress per cell
    ruler = json.loads(out.read_text())["ruler"]
    assert ruler["lengths"] == [512] and set(ruler["tasks"]) == {"niah_single_1", "fwe"}
    needle = ruler["tasks"]["niah_single_1"]["by_length"]["512"]
    assert needle["examples"] == 2 and set(needle["by_depth"]) == {"0.0", "1.0"}
    assert ruler["tasks"]["fwe"]["by_length"]["512"]["by_depth"].keys() == {"none"}
    assert ruler["tasks"]["niah_single_1"]["metric"] == "string_match_all"
    table = (out.parent / "eval_ruler.md").read_text()
    assert table.splitlines()[0] == "| task | 512 |" and "| niah_single_1 | " in table
    for task in ("niah_single_1", "fwe"):
        assert (out.parent / f"eval_ruler_{task}.png").stat().st_size > 1000


@pytest.mark.parametrize("flags, message", [
    (["--ruler-tasks", "niah_single_9"], "unknown or no task(s) ['niah_single_9']"),
    (["--ruler-depths", "0,2"], "every depth must be in [0, 1]"),
    (["--lengths", "4096"], "every length exceeds model.max_seq_len=512"),
    (["--ahn-mode", "teacher"], "--ahn-mode teacher needs an AHN run (model.kind=ahn)"),
])
def test_bad_ruler_flags_are_one_line_errors(trained_run, capsys, flags, message):
    out = trained_run / "bad" / "eval.json"
    assert eval_entry.main(["--run", str(trained_run), "--suites", "ruler", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_sweep_evaluation_runs_the_ruler_suite_and_gives_the_loss_an_interval(trained_run):
    from seqmodels.sweeps.evaluate import evaluate_run
    settings = {"suites": ["perplexity", "ruler"], "batch_size": 2, "max_batches": 2,
                "ruler": {"lengths": [512], "tasks": ["niah_single_1"], "depths": [0.5], "per_depth": 2, "seed": 3}}
    results = evaluate_run(trained_run, settings, last_only=True)
    low, high = results["curve"][-1]["loss_interval"]
    assert low <= results["curve"][-1]["loss"] <= high
    assert results["perplexity"]["interval"]["units_are"] == "documents"
    assert results["ruler"]["tasks"]["niah_single_1"]["by_length"]["512"]["examples"] == 2


@pytest.mark.slow
def test_a_full_attention_model_trained_on_the_tasks_format_learns_it_at_a_short_length(tmp_path):
    """A 2-layer Transformer++ (d_model 128, a short convolution of 4 over q, k, v) trained on ``data.source=ruler``
    rows of ``niah_single_1`` at 192 tokens finds the needle in held-out prompts of that length: greedy decoding
    scored as the suite scores it reaches 0.6 or more over 20 prompts at 5 depths, where a guessed 7-digit value
    scores 0. The tokens are a 512-token BPE trained on the task's own text (byte rows of 512, decoded): 192 of
    them hold the template and about three haystack lines, so the needle's place varies with its depth.

    Found by probes (2026-12-05, experiments/ruler/README.md): the answer loss falls off its plateau at step
    450-600 here; without the convolution, at learning rate 3e-3, on bytes, or at 256 tokens it stays on a
    plateau for 800-1,000 steps; at 128 tokens the row holds one haystack line, so the needle has two places.
    Measured: 0.95 (interval 0.85-1.00), answer loss 0.005 at step 700, in 189 s on 2 cores. Why the bar is
    0.6: the trajectory depends on the float reductions, and a single-threaded probe of the same run scored
    0.6 over 10 prompts at 900 steps. Its continuations began with the needle's value at every depth; its misses were
    copy slips inside values with repeated digits (``4297058`` -> ``42970558``)."""
    from seqmodels.data.builders.ruler_text import write_ruler_texts
    from seqmodels.data.builders.tokenizer import train_bpe
    texts = write_ruler_texts(["niah_single_1"], 900, 512, str(tmp_path / "task.jsonl"))
    tokenizer_dir = train_bpe(texts, 512, str(tmp_path / "tokenizer"))
    run_dir = tmp_path / "run"
    overrides = {"model.d_model": 128, "model.num_heads": 8, "model.mixers": "[attention] * 2",
                 "model.attention.conv_kernel": 4, "model.vocab_size": 512, "model.max_seq_len": 192,
                 "data.source": "ruler", "data.tokenizer": f"hf:{tokenizer_dir}", "data.seq_len": 191,
                 "train.batch_size": 16, "train.steps": STEPS_TO_LEARN, "optim.learning_rate": 1e-2,
                 "optim.schedule": "constant", "train.run_dir": str(run_dir), "log.progress": "never",
                 "checkpoint.every_steps": STEPS_TO_LEARN, "checkpoint.async_save": False}
    assert train_entry.main([f"{key}={value}" for key, value in overrides.items()]) == 0
    out = tmp_path / "eval.json"
    assert eval_entry.main(["--run", str(run_dir), "--suites", "ruler", "--lengths", "192", "--ruler-tasks",
                            "niah_single_1", "--ruler-examples", "4", "--batch-size", "10", "--out", str(out)]) == 0
    cell = json.loads(out.read_text())["ruler"]["tasks"]["niah_single_1"]["by_length"]["192"]
    assert cell["examples"] == 20 and cell["score"] >= 0.6, cell
