"""train.py and eval.py as a user runs them: results on good input, one-paragraph errors on bad input."""

import json
import math
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import eval as eval_entry
import train as train_entry
from conftest import snapshot, tiny_overrides
from seqmodels.data.pipeline import make_eval_batches
from seqmodels.runs.load import load_run


@pytest.fixture
def trained_run(tiny_trained_run, tmp_path):
    """A copy of the session's tiny run (10 steps): these tests write into it or try to."""
    run_dir, corpus = tiny_trained_run
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run", corpus


def test_eval_reports_heldout_perplexity_and_loss_by_position(trained_run, capsys):
    run_dir, _ = trained_run
    assert eval_entry.main(["--run", str(run_dir), "--max-batches", "2"]) == 0
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["step"] == 10
    perplexity = result["perplexity"]
    # The held-out loss recomputed apart from the suite: the saved model's logits on the same two batches,
    # log-softmax in float64, averaged over the loss mask.
    config, model, step = load_run(run_dir)
    assert step == 10
    total, tokens = 0.0, 0
    for batch in make_eval_batches(config.data, batch_size=8, max_batches=2):
        logits, _ = model(jnp.asarray(batch["inputs"]), segment_ids=jnp.asarray(batch["segment_ids"]),
                          positions=jnp.asarray(batch["positions"]))
        logits = np.asarray(logits, np.float64)
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, np.asarray(batch["targets"])[..., None], axis=-1)[..., 0]
        mask = np.asarray(batch["loss_mask"]) > 0
        total, tokens = total - picked[mask].sum(), tokens + int(mask.sum())
    assert perplexity["tokens"] == tokens > 0
    assert perplexity["loss"] == pytest.approx(total / tokens, rel=1e-5)
    assert perplexity["perplexity"] == pytest.approx(math.exp(total / tokens), rel=1e-5)
    buckets = perplexity["by_position"]
    assert [b["positions"] for b in buckets][:4] == [[0, 1], [1, 2], [2, 4], [4, 8]]
    assert sum(b["tokens"] for b in buckets) == perplexity["tokens"] > 0
    assert (run_dir / "eval_loss_by_position.png").stat().st_size > 1000


@pytest.mark.parametrize("make_args, message", [
    (lambda tmp, corpus: ["--config", str(tmp / "missing.yaml")], "does not exist"),
    (lambda tmp, corpus: ["--config", str(tmp / "broken.yaml")], "is not valid YAML"),
    (lambda tmp, corpus: tiny_overrides(tmp / "r", str(tmp / "nothing" / "*.txt")), "data.path"),
    (lambda tmp, corpus: tiny_overrides(tmp / "r", corpus, data__seq_len=128), "exceeds model.max_seq_len=64"),
    (lambda tmp, corpus: tiny_overrides(tmp / "r", corpus, model__vocab_size=100), "model.vocab_size=100"),
    (lambda tmp, corpus: tiny_overrides(tmp / "r", corpus, model__mixers="[attention, mamba9]"),
     "unknown mixer 'mamba9'"),
])
def test_bad_input_gives_one_paragraph_error_and_writes_nothing(tmp_path, tiny_corpus, capsys, make_args, message):
    (tmp_path / "broken.yaml").write_text("model: {d_model: [\n")
    before = snapshot(tmp_path)
    assert train_entry.main(make_args(tmp_path, tiny_corpus)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err and "Traceback" not in err
    assert snapshot(tmp_path) == before


def test_checkpoint_of_another_architecture_is_refused_and_left_untouched(trained_run, capsys):
    run_dir, corpus = trained_run
    before = snapshot(run_dir)
    assert train_entry.main(tiny_overrides(run_dir, corpus, model__d_model=64)) == 2
    err = capsys.readouterr().err
    assert "belongs to another architecture" in err and "model.d_model: checkpoint has 32, config has 64" in err
    assert snapshot(run_dir) == before


def test_eval_of_a_directory_without_a_run_is_an_error(tmp_path, capsys):
    assert eval_entry.main(["--run", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err
