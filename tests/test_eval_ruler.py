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
    rows of ``niah_single_1`` at 192 tokens finds the needle in held-out prompts of that length, in at least one of
    three seeds tried in turn: greedy decoding scored as the suite scores it reaches 0.6 or more over 20 prompts at
    5 depths, where a guessed 7-digit value scores 0. The tokens are a 512-token BPE trained on the task's own
    text (byte rows of 512, decoded) with every digit a token of its own (``split_digits``, as SmolLM2's
    tokenizer): 192 of them hold the template and about three haystack lines, so the needle's place varies with
    its depth. 800 steps of 16 rows, learning rate 1e-2 with cosine decay from step 0.

    Why seeds in turn: this model leaves its plateau (answer loss about 1.6, the format without the value) at a
    step that varies with the seed and, for one seed, with the machine's floating-point detail: the previous
    recipe scored 0.95 here and 0.25 on the CI machine at the same seed. Probes of this recipe at ``train.seed``
    0-5 (2026-12-06, one thread each; seed 0 also as this test, identical): 0.95 / 0.95 / 0.85 / 0.80 / 0.00 /
    0.60 (seed 4 never left the plateau, seed 5 left it last, at step 400-500); the chance that three seeds all
    stay on it is small where one seed's is not. Longer cosine schedules did not make a single seed reliable
    (1,600 steps: seed 0 0.45, seed 4 0.50, seed 1 0.95). Digits are split because a BPE that merges them
    (``' 4'``, ``'29'``, ...) adds a second plateau near 0.3, the value copied and its first token guessed
    (``3232176`` -> ``4232176``). experiments/ruler/README.md has the probes."""
    from seqmodels.data.builders.ruler_text import write_ruler_texts
    from seqmodels.data.builders.tokenizer import train_bpe
    texts = write_ruler_texts(["niah_single_1"], 900, 512, str(tmp_path / "task.jsonl"))
    tokenizer_dir = train_bpe(texts, 512, str(tmp_path / "tokenizer"), split_digits=True)
    cells = {}
    for seed in range(3):
        run_dir = tmp_path / f"run_{seed}"
        overrides = {"model.d_model": 128, "model.num_heads": 8, "model.mixers": "[attention] * 2",
                     "model.attention.conv_kernel": 4, "model.vocab_size": 512, "model.max_seq_len": 192,
                     "data.source": "ruler", "data.tokenizer": f"hf:{tokenizer_dir}", "data.seq_len": 191,
                     "train.batch_size": 16, "train.steps": STEPS_TO_LEARN, "train.seed": seed,
                     "optim.learning_rate": 1e-2, "optim.schedule": "cosine", "optim.warmup_steps": 0,
                     "train.run_dir": str(run_dir), "log.progress": "never", "checkpoint.every_steps": STEPS_TO_LEARN,
                     "checkpoint.async_save": False,
                     "train.guard_steps": 0}  # the loss of 16 answers spikes when one is wrong: save the last step
        assert train_entry.main([f"{key}={value}" for key, value in overrides.items()]) == 0
        out = run_dir / "eval.json"
        assert eval_entry.main(["--run", str(run_dir), "--suites", "ruler", "--lengths", "192", "--ruler-tasks",
                                "niah_single_1", "--ruler-examples", "4", "--batch-size", "10", "--out", str(out)]) == 0
        cells[seed] = json.loads(out.read_text())["ruler"]["tasks"]["niah_single_1"]["by_length"]["192"]
        assert cells[seed]["examples"] == 20
        if cells[seed]["score"] >= 0.6:
            break
    assert max(cell["score"] for cell in cells.values()) >= 0.6, {seed: cell["score"] for seed, cell in cells.items()}
