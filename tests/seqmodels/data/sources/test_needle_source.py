"""Needle in a haystack: row layout, depth control, training batches, and greedy-continuation scoring."""

import numpy as np
import pytest

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.config_io import load_config
from seqmodels.data.pipeline import make_train_dataset
from seqmodels.data.sources.needle import make_needle_example, needle_eval_examples
from seqmodels.data.tokenizers import BOS_ID, ByteTokenizer
from seqmodels.evaluation.needle import needle_accuracy
from seqmodels.models import build_model, generate

TOKENIZER = ByteTokenizer()


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_needle_sits_at_the_requested_depth_and_the_query_asks_for_it(depth):
    example = make_needle_example(np.random.default_rng(5), 200, depth, key_length=3, value_length=2)
    assert example.prompt[0] == BOS_ID and example.prompt.size + example.answer.size == 200
    text = TOKENIZER.decode(example.prompt[1:])
    value = TOKENIZER.decode(example.answer)
    query_start = text.rindex(" #")
    key = text[query_start + 2:-1]
    assert text.endswith("=") and len(key) == 3 and key.isdigit() and len(value) == 2 and value.isdigit()
    needle = f" #{key}={value}."
    assert text.count("#") == 2 and text.count(needle) == 1
    haystack = text[:query_start]
    before = haystack.index(needle)
    filler_length = len(haystack) - len(needle)
    assert before == round(depth * filler_length)
    assert set(haystack.replace(needle, "")) <= set("abcdefghijklmnopqrstuvwxyz ")


def test_distractors_carry_other_keys():
    example = make_needle_example(np.random.default_rng(1), 120, 0.5, distractors=3)
    text = TOKENIZER.decode(example.prompt[1:])
    keys = [piece[:2] for piece in text.split(" #")[1:]]  # three distractors, the needle, the query
    assert len(keys) == 5 and len(set(keys[:-1])) == 4  # all hidden keys distinct
    assert keys[:-1].count(keys[-1]) == 1  # the query asks for exactly one of them


def test_training_batches_are_deterministic_one_example_per_row_with_loss_on_the_answer():
    config = load_config(None, ["data.source=needle", "data.seq_len=40", "data.needle_value_length=3"]).data
    first = next(iter(make_train_dataset(config, batch_size=4)))
    again = next(iter(make_train_dataset(config, batch_size=4)))
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
    assert first["inputs"].shape == (4, 40) and np.all(first["segment_ids"] == 1)
    assert np.all(first["loss_mask"].sum(axis=1) == 3)
    assert np.all(first["loss_mask"][:, -3:] == 1)  # the answer closes the row
    answers = first["targets"][:, -3:]
    assert np.all((answers >= ord("0")) & (answers <= ord("9")))
    assert len({tuple(row) for row in first["inputs"]}) == 4  # every row a different example


@pytest.mark.parametrize("override, message", [
    ("data.seq_len=10", "data.seq_len: 10 is too short for a needle row"),
    ("data.needle_value_length=0", "data.needle_value_length: must be >= 1"),
    ("data.needle_distractors=-1", "data.needle_distractors: must be >= 0"),
])
def test_bad_needle_settings_are_rejected_at_config_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["data.source=needle", override])


def test_needle_accuracy_scores_the_greedy_continuation_exactly():
    model = build_model(ModelConfig(d_model=32, num_heads=2, mixers=("attention",), max_seq_len=64), seed=0)
    examples = needle_eval_examples(30, [0.0, 1.0], 3, seed=0)
    prompts = np.stack([e.prompt for e in examples])
    # Batches of 4 rows, the shape needle_accuracy decodes with below (one compilation).
    first, _ = generate(model, prompts[:4], 2)
    second, _ = generate(model, np.concatenate([prompts[4:], prompts[4:]]), 2)
    continuation = np.concatenate([np.asarray(first)[:, -2:], np.asarray(second)[:2, -2:]])
    # Depth 0: the answers are what the model decodes; depth 1: one token off, so never matched.
    relabelled = [type(e)(e.prompt, continuation[i] if e.depth == 0.0 else (continuation[i] + [0, 1]) % 256, e.depth)
                  for i, e in enumerate(examples)]
    result = needle_accuracy(model, relabelled, batch_size=4)  # 6 examples: a padded second batch
    assert result == {"accuracy": 0.5, "examples": 6, "by_depth": {0.0: 1.0, 1.0: 0.0}}
