"""CFL examples as token rows: layout, labels, training stream (determinism, resume), evaluation sets."""

import numpy as np
import pytest

from seqmodels.config import ConfigError, DataConfig
from seqmodels.config_io import load_config
from seqmodels.data import FIELDS, make_eval_batches, make_train_dataset
from seqmodels.data.cfl.batches import length_buckets
from seqmodels.data.cfl.languages import LANGUAGES
from seqmodels.data.cfl.recognisers import RECOGNISERS
from seqmodels.data.cfl.rows import ACCEPT_ID, CLS_ID, REJECT_ID, VOCAB_SIZE, decode, encode, evaluation_set
from seqmodels.data.pipeline import describe_source, required_vocab_size
from seqmodels.evaluation.cfl import labels_of


def cfl_data(seed=0, **cfl) -> DataConfig:
    values = {"max_length": 16, **cfl}
    overrides = [f"data.cfl.{key}={value}" for key, value in values.items()]
    return load_config(None, ["data.source=cfl", "data.seq_len=18", f"data.seed={seed}", *overrides]).data


def check_rows(batch):
    """Every row: [BOS] w [CLS] then empty; label = recogniser(w) as the target at [CLS]; loss there only."""
    assert set(batch) == set(FIELDS)
    for row in range(batch["inputs"].shape[0]):
        size = int(batch["segment_ids"][row].sum())
        tokens = batch["inputs"][row]
        language, text = decode(tokens[:size])
        assert (tokens[size:] == 0).all() and (batch["segment_ids"][row, size:] == 0).all()
        assert batch["positions"][row, :size].tolist() == list(range(size))
        assert batch["loss_mask"][row].tolist() == [0.0] * (size - 1) + [1.0] + [0.0] * (tokens.size - size)
        label = batch["targets"][row, size - 1]
        assert label == (ACCEPT_ID if RECOGNISERS[language](text) else REJECT_ID)
        assert ACCEPT_ID not in tokens and REJECT_ID not in tokens  # the label is never an input
        yield language, text


def test_encode_decode_round_trip_and_alphabet_check():
    for language, spec in LANGUAGES.items():
        assert decode(encode(language, spec.alphabet)) == (language, spec.alphabet)
    assert encode("dyck1", "()")[-1] == CLS_ID
    with pytest.raises(ValueError, match="outside the dyck1 alphabet"):
        encode("dyck1", "(a)")


def test_training_rows_hold_one_labelled_example_each_and_cover_languages_and_lengths():
    data = cfl_data()
    assert required_vocab_size(data) == VOCAB_SIZE
    assert "cfl languages" in describe_source(data)
    iterator = iter(make_train_dataset(data, batch_size=64))
    seen = [item for _ in range(4) for item in check_rows(next(iterator))]
    assert {language for language, _ in seen} == set(LANGUAGES)
    assert all(1 <= len(text) <= 16 for _, text in seen)
    assert len({len(text) for _, text in seen}) >= 10
    labels = [RECOGNISERS[language](text) for language, text in seen]
    assert 0.35 < np.mean(labels) < 0.65


def test_each_training_batch_holds_one_length_range_in_rows_just_long_enough():
    data = cfl_data(length_buckets=4)
    buckets = length_buckets(data.cfl)
    assert buckets == [(1, 4), (5, 8), (9, 12), (13, 16)]
    iterator = iter(make_train_dataset(data, batch_size=16))
    row_lengths = set()
    for _ in range(12):
        batch = next(iterator)
        list(check_rows(batch))
        lengths = batch["segment_ids"].sum(axis=1) - 2
        low, high = next(bucket for bucket in buckets if bucket[0] <= lengths.min() <= bucket[1])
        assert lengths.max() <= high
        assert batch["inputs"].shape[1] == (data.seq_len if high == 16 else high + 2)
        row_lengths.add(batch["inputs"].shape[1])
    assert len(row_lengths) >= 3
    single = next(iter(make_train_dataset(cfl_data(length_buckets=1), batch_size=16)))
    assert single["inputs"].shape == (16, data.seq_len)


def test_length_curriculum_opens_longer_ranges_as_training_proceeds():
    data = cfl_data(length_buckets=4, curriculum_steps=40)
    iterator = iter(make_train_dataset(data, batch_size=4))
    longest = [int((next(iterator)["segment_ids"].sum(axis=1) - 2).max()) for _ in range(60)]
    assert max(longest[:10]) <= 4  # batches 0-9: the first range only
    assert max(longest[10:20]) <= 8 and max(longest[20:30]) <= 12
    assert max(longest[30:]) > 12  # from batch 30 on, all four ranges


def test_training_stream_is_deterministic_shards_by_process_and_resumes_exactly():
    data = cfl_data(languages="[dyck2, bfvp]")
    first = iter(make_train_dataset(data, batch_size=4))
    batches = [next(first) for _ in range(3)]
    again = iter(make_train_dataset(data, batch_size=4))
    np.testing.assert_array_equal(next(again)["inputs"], batches[0]["inputs"])
    state = again.get_state()
    resumed = iter(make_train_dataset(data, batch_size=4))
    resumed.set_state(state)
    for want in batches[1:]:
        got = next(resumed)
        for field in FIELDS:
            np.testing.assert_array_equal(got[field], want[field])
    other = iter(make_train_dataset(data, batch_size=4, process_index=1, process_count=2))
    assert not np.array_equal(next(other)["inputs"], batches[0]["inputs"])
    other_seed = iter(make_train_dataset(cfl_data(seed=1, languages="[dyck2, bfvp]"), batch_size=4))
    assert not np.array_equal(next(other_seed)["inputs"], batches[0]["inputs"])


def test_heldout_batches_are_labelled_rows_from_another_stream():
    data = cfl_data(languages="[marked_palindrome]")
    heldout = make_eval_batches(data, batch_size=8, max_batches=2)
    assert len(heldout) == 2 and heldout[0]["inputs"].shape == (8, 18)
    list(check_rows(heldout[0]))
    train_rows = next(iter(make_train_dataset(data, batch_size=8)))
    assert not np.array_equal(heldout[0]["inputs"], train_rows["inputs"])


def test_evaluation_set_rows_have_exactly_the_requested_length_and_balanced_labels():
    batch = evaluation_set("dyck2", 12, 20, seed=0)
    assert batch["inputs"].shape == (20, 14) and batch["segment_ids"].all()
    assert [language for language, _ in check_rows(batch)] == ["dyck2"] * 20
    assert labels_of(batch).sum() == 10


@pytest.mark.parametrize("overrides, message", [
    (["data.cfl.languages=[dyck1, dyck9]"], "data.cfl.languages: unknown"),
    (["data.cfl.languages=[dyck1, dyck1]"], "lists a language twice"),
    (["data.seq_len=33"], "data.seq_len: 33 cannot hold"),
    (["data.cfl.min_length=10", "data.cfl.max_length=5"], "data.cfl.max_length"),
])
def test_bad_cfl_data_config_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        defaults = {"data.source": "cfl", "data.cfl.max_length": 32, "data.seq_len": 34}
        defaults.update(item.split("=", 1) for item in overrides)
        load_config(None, [f"{key}={value}" for key, value in defaults.items()])


def test_language_without_positives_in_the_training_range_is_refused():
    data = cfl_data(languages="[anbn_cmdm]", max_length=3)
    with pytest.raises(ConfigError, match="anbn_cmdm has no positive string of a length in"):
        required_vocab_size(data)
