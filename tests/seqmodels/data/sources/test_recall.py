"""Generated recall tasks: row layout, answers, determinism, config checks, resumable iteration."""

import numpy as np
import pytest

from seqmodels.config import ConfigError, DataConfig, SyntheticConfig
from seqmodels.config_io import load_config
from seqmodels.data import make_eval_batches, make_train_dataset
from seqmodels.data.pipeline import describe_source, required_vocab_size
from seqmodels.data.sources.recall import BLANK_ID, BOS_ID, SEP_ID

SETTINGS = SyntheticConfig(vocab_size=40, num_pairs=5, num_queries=3, num_copy_tokens=6)


def batch_of(source, seq_len=32, seed=0, batch_size=8):
    cfg = DataConfig(source=source, seq_len=seq_len, seed=seed, synthetic=SETTINGS)
    return next(iter(make_train_dataset(cfg, batch_size=batch_size)))


def test_mqar_rows_hold_pairs_then_queries_and_the_loss_is_on_answers_only():
    batch = batch_of("mqar")
    keys_end = 3 + (40 - 3) // 2  # keys [3, 21), values [21, 39)
    for inputs, targets, mask in zip(batch["inputs"], batch["targets"], batch["loss_mask"]):
        assert inputs[0] == BOS_ID
        keys, values = inputs[1:11:2], inputs[2:11:2]
        assert len(set(keys.tolist())) == 5 and (keys < keys_end).all() and (values >= keys_end).all()
        answers = np.flatnonzero(mask)
        assert len(answers) == 3 and set(mask.tolist()) == {0.0, 1.0}
        for position in answers:  # the input there is a queried key, the target its value
            assert position >= 10 and inputs[position] in keys
            assert targets[position] == values[keys.tolist().index(inputs[position])]
        rest = np.setdiff1d(np.arange(11, 32), np.r_[answers, answers + 1])
        assert (inputs[rest] == BLANK_ID).all()
    assert (batch["segment_ids"] == 1).all()  # one example per row


def test_selective_copy_rows_copy_the_scattered_tokens_in_order():
    batch = batch_of("selective_copy")
    for inputs, targets, mask in zip(batch["inputs"], batch["targets"], batch["loss_mask"]):
        row = np.r_[inputs, targets[-1]]
        separator = int(np.flatnonzero(row == SEP_ID)[0])
        content = row[1:separator][row[1:separator] != BLANK_ID]
        assert len(content) == 6 and (row[separator + 1:] == content).all()
        assert np.flatnonzero(mask).tolist() == list(range(separator, 32))  # predicting each copied token


def test_examples_are_a_function_of_the_seed_and_heldout_examples_differ_from_training():
    np.testing.assert_array_equal(batch_of("mqar")["inputs"], batch_of("mqar")["inputs"])
    assert not np.array_equal(batch_of("mqar")["inputs"], batch_of("mqar", seed=1)["inputs"])
    cfg = DataConfig(source="mqar", seq_len=32, synthetic=SETTINGS)
    heldout = make_eval_batches(cfg, batch_size=8, max_batches=2)
    assert len(heldout) == 2 and not np.array_equal(heldout[0]["inputs"], batch_of("mqar")["inputs"])
    assert required_vocab_size(cfg) == 40 and "3 queries per row of 32 tokens" in describe_source(cfg)


def test_a_restored_iterator_continues_with_the_same_rows():
    cfg = DataConfig(source="selective_copy", seq_len=24, synthetic=SETTINGS)
    iterator = iter(make_train_dataset(cfg, batch_size=4))
    next(iterator)
    state = iterator.get_state()
    expected = next(iterator)
    fresh = iter(make_train_dataset(cfg, batch_size=4))
    fresh.set_state(state)
    np.testing.assert_array_equal(next(fresh)["inputs"], expected["inputs"])


@pytest.mark.parametrize("overrides, message", [
    (["data.source=mqar", "data.seq_len=15", "data.synthetic.num_pairs=4"],
     r"data.seq_len: 15 cannot hold .* set data.seq_len >= 16"),
    (["data.source=selective_copy", "data.seq_len=12", "data.synthetic.num_copy_tokens=6"],
     r"data.seq_len: 12 .* set data.seq_len >= 13"),
    (["data.source=mqar", "data.synthetic.vocab_size=16", "data.synthetic.num_pairs=7"],
     r"data.synthetic.num_pairs: 7 pairs need as many distinct keys; data.synthetic.vocab_size=16 has 6"),
    (["data.source=mqar", "data.synthetic.num_queries=-1"], r"data.synthetic.num_queries: must be >= 0, got -1"),
])
def test_impossible_task_settings_are_rejected_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
