"""The text needle suite: rows built from held-out text, and the greedy-retrieval condition."""

import json

import numpy as np
import pytest

from seqmodels.config_io import load_config
from seqmodels.data.tokenizers import ByteTokenizer
from seqmodels.evaluation.text_needle import NEEDLE, QUERY, answer_hits, text_needle_rows

TEXTS = [f"Held-out document {i} talks about rivers, bridges and the weather. " * 6 for i in range(12)]


@pytest.fixture
def config(tmp_path):
    heldout = tmp_path / "validation.jsonl"
    heldout.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return load_config(None, ["data.source=jsonl", f"data.path={heldout}", f"data.heldout_path={heldout}",
                              "data.seq_len=256"])


def test_rows_hide_the_needle_at_its_depth_and_end_with_query_and_answer(config):
    rows, answers, depths = text_needle_rows(config, length=256, depths=[0.0, 0.5, 1.0], per_depth=3, seed=7)
    assert rows.shape == (9, 256) and depths == [0.0] * 3 + [0.5] * 3 + [1.0] * 3
    decode = ByteTokenizer().decode
    for row, answer, depth in zip(rows, answers, depths):
        assert row[0] == ByteTokenizer.bos_id and answer.stop == 256
        text = decode(row)
        value = decode(row[answer])
        assert value.startswith(" ") and value.strip().isdigit() and len(value.strip()) == 4
        needle = NEEDLE.format(value=value.strip())
        assert text.count(needle) == 1 and text.endswith(QUERY + value)
        filler = 256 - 1 - len(needle) - len(QUERY) - len(value)
        assert abs(text.index(needle) - depth * filler) <= 1
    again, _, _ = text_needle_rows(config, length=256, depths=[0.0, 0.5, 1.0], per_depth=3, seed=7)
    assert np.array_equal(rows, again)


def test_answer_hits_is_greedy_exact_match():
    targets = np.array([[1, 2, 3, 4], [1, 2, 3, 4]])
    answers = [slice(3, 5), slice(3, 5)]  # row tokens 3..4 = targets[2:4]
    predicted = np.array([[9, 9, 3, 4], [9, 9, 3, 0]])
    assert answer_hits(predicted, targets, answers) == [True, False]


def test_a_length_beyond_the_run_or_too_short_is_refused(config):
    with pytest.raises(ValueError, match="exceeds the run's data.seq_len=256"):
        text_needle_rows(config, length=512, depths=[0.5], per_depth=1)
    with pytest.raises(ValueError, match="cannot hold the needle, query and answer"):
        text_needle_rows(config, length=60, depths=[0.5], per_depth=1)
