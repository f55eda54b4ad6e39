"""Training with the sequence split over ``mesh.context``: the same losses as without, and a resume across
context sizes continues the same curve."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_overrides
from seqmodels.config_io import load_config
from seqmodels.training.loop import train

MIXED = {"model__mixers": "[gated_deltanet, attention] * 1", "model__deltanet__chunk_size": 16, "train__steps": 6,
         "checkpoint__every_steps": 3}


def losses(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


def run(run_dir, corpus, **extra):
    return train(load_config(None, tiny_overrides(run_dir, corpus, **MIXED, **extra)))


@pytest.mark.slow
def test_losses_with_the_sequence_split_equal_the_unsplit_run_and_resume_across_context_sizes(tmp_path, tiny_corpus):
    run(tmp_path / "whole", tiny_corpus, mesh__data=8, mesh__context=1)
    run(tmp_path / "split", tiny_corpus, mesh__data=2, mesh__context=4, train__exit_at_step=3)
    run(tmp_path / "split", tiny_corpus, mesh__data=4, mesh__context=2)  # resumes at step 4 on another split
    whole, split = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert sorted(whole) == sorted(split) == list(range(1, 7))
    # float32; the split rows sum the loss and the recurrence's state chain in another order: 2e-5
    np.testing.assert_allclose([split[s] for s in range(1, 7)], [whole[s] for s in range(1, 7)], rtol=0, atol=2e-5)


TITANS = {"model__mixers": "[atlas] * 1", "model__atlas__window": 2, "model__atlas__chunk_size": 8,
          "model__atlas__poly_degree": 1, "model__atlas__ns_steps": 0, "model__atlas__memory_depth": 1,
          "train__steps": 3, "checkpoint__every_steps": 3}


@pytest.mark.slow
def test_an_atlas_run_with_the_sequence_split_logs_its_sequential_cost_and_equals_the_unsplit_run(
        tmp_path, tiny_corpus, capsys):
    train(load_config(None, tiny_overrides(tmp_path / "whole", tiny_corpus, **TITANS, mesh__data=8,
                                           mesh__context=1)))
    assert "in sequence" not in capsys.readouterr().out
    train(load_config(None, tiny_overrides(tmp_path / "split", tiny_corpus, **TITANS, mesh__data=2,
                                           mesh__context=4)))
    assert ("atlas: mesh.context=4 runs the Atlas memory's 4 shards in sequence, each from the state the previous "
            "one leaves (4x one shard's memory-op time per layer, 4 state ppermutes)") in capsys.readouterr().out
    whole, split = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert sorted(whole) == sorted(split) == [1, 2, 3]
    # float32, as above: the split rows sum the loss in another order
    np.testing.assert_allclose([split[s] for s in (1, 2, 3)], [whole[s] for s in (1, 2, 3)], rtol=0, atol=2e-5)
