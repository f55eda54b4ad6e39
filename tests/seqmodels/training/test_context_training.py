"""Training with the sequence split over ``mesh.context``: the same losses as without, and a resume across
context sizes continues the same curve."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_overrides
from seqmodels.config_io import load_config
from seqmodels.training.loop import train

# A delta rule (state passing), attention and Titans (the Atlas memory's shards in sequence: window 2, a linear
# memory in chunks of 8, one per shard at mesh.context = 4 over data.seq_len = 32, two at 2).
MIXED = {"model__mixers": "[gated_deltanet, attention, atlas] * 1", "model__deltanet__chunk_size": 16,
         "model__atlas__window": 2, "model__atlas__chunk_size": 8, "model__atlas__poly_degree": 1,
         "model__atlas__ns_steps": 0, "model__atlas__memory_depth": 1, "train__steps": 6, "checkpoint__every_steps": 3}
NOTE = ("atlas: mesh.context={} runs the Atlas memory's {} shards in sequence, each from the state the previous one "
        "leaves ({}x one shard's memory-op time per layer, {} state ppermutes)")


def losses(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


def run(run_dir, corpus, **extra):
    return train(load_config(None, tiny_overrides(run_dir, corpus, **MIXED, **extra)))


@pytest.mark.slow
def test_losses_with_the_sequence_split_equal_the_unsplit_run_and_resume_across_context_sizes(tmp_path, tiny_corpus,
                                                                                              capsys):
    """The split runs also log the Atlas memory's sequential cost, the unsplit one does not."""
    run(tmp_path / "whole", tiny_corpus, mesh__data=8, mesh__context=1)
    assert "in sequence" not in capsys.readouterr().out
    run(tmp_path / "split", tiny_corpus, mesh__data=2, mesh__context=4, train__exit_at_step=3)
    assert NOTE.format(*[4] * 4) in capsys.readouterr().out
    run(tmp_path / "split", tiny_corpus, mesh__data=4, mesh__context=2)  # resumes at step 4 on another split
    assert NOTE.format(*[2] * 4) in capsys.readouterr().out
    whole, split = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert sorted(whole) == sorted(split) == list(range(1, 7))
    # float32; the split rows sum the loss and the recurrences' state chains in another order: 2e-5
    np.testing.assert_allclose([split[s] for s in range(1, 7)], [whole[s] for s in range(1, 7)], rtol=0, atol=2e-5)
