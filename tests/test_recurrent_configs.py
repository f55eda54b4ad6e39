"""The recurrent-mixer configs: each builds its model, and one trains from train.py on MQAR and is scored by eval.py."""

import json
from pathlib import Path

import jax
import pytest

import eval as eval_entry
import train as train_entry
from seqmodels.config_io import load_config
from seqmodels.models import abstract_model

CONFIGS = ["mamba2", "deltanet", "gated_deltanet", "muonssm_mamba2", "muonssm_gated_deltanet", "longhorn",
           "muonssm_longhorn"]
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_a_model_of_its_mixer(name):
    config = load_config(ROOT / "configs" / f"{name}.yaml")
    assert set(config.model.mixers) == {name}
    _, state = abstract_model(config.model)  # shapes only: nothing is allocated or compiled
    params = sum(x.size for x in jax.tree.leaves(state))
    assert 5e6 < params < 2e7, params


@pytest.mark.slow
def test_a_recurrent_config_runs_three_steps_on_mqar_and_eval_scores_each_answer(tmp_path, capsys):
    """An end-to-end run (three steps learn nothing measurable): eval scores the run's own task, every
    answer once (accuracy a whole number of the 64 answers)."""
    run_dir = tmp_path / "run"
    overrides = ["model.d_model=32", "model.num_heads=2", "model.mixers=[muonssm_gated_deltanet] * 2",
                 "model.deltanet.head_dim=16", "model.deltanet.value_head_dim=16", "model.deltanet.chunk_size=16",
                 "model.vocab_size=32", "model.max_seq_len=32", "data.source=mqar", "data.seq_len=32",
                 "data.synthetic.vocab_size=32", "data.synthetic.num_pairs=4", "train.steps=3", "train.batch_size=8",
                 f"train.run_dir={run_dir}", "log.progress=never", "log.tensorboard=false",
                 "checkpoint.async_save=false"]
    assert train_entry.main(["--config", str(ROOT / "configs" / "muonssm_gated_deltanet.yaml"), *overrides]) == 0
    assert eval_entry.main(["--run", str(run_dir), "--suites", "recall", "--batch-size", "8",
                            "--max-batches", "2"]) == 0
    recall = json.loads((run_dir / "eval.json").read_text())["recall"]
    assert list(recall) == ["mqar"]  # the run's own task
    assert recall["mqar"]["answers"] == 2 * 8 * 4 and recall["mqar"]["examples"] == 16
    correct = recall["mqar"]["accuracy"] * recall["mqar"]["answers"]
    assert 0 <= correct <= 64 and correct == pytest.approx(round(correct), abs=1e-6) and recall["mqar"]["loss"] > 0
