"""Packing elements into rows: invariants, a vectorised reference, exact resume from any state."""

import json

import grain
import numpy as np
import pytest

from seqmodels.data.packing import FIELDS, pack_and_batch, pack_examples, pad_batch

SEQ_LEN = 12


def make_elements(lengths, seed=0, answers_only=False):
    """Elements of random tokens; loss on all tokens but the first, or on random ones.

    With ``answers_only`` the first token is always marked too: packing must still drop that loss,
    since the token before it belongs to another element.
    """
    rng = np.random.default_rng(seed)
    elements = []
    for n in lengths:
        tokens = rng.integers(1, 250, size=n).astype(np.int32)
        mask = (rng.random(n) < 0.3) if answers_only else np.arange(n) > 0
        if answers_only and n:
            mask[0] = True
        elements.append({"tokens": tokens, "loss_mask": mask.astype(np.float32)})
    return elements


def as_stream(elements):
    return grain.MapDataset.source(elements).to_iter_dataset()


def reference_rows(elements, row_length):
    """The packed rows computed in one vectorised pass over the concatenated stream."""
    elements = [e for e in elements if len(e["tokens"])]
    tokens = np.concatenate([e["tokens"] for e in elements])
    masks = np.concatenate([e["loss_mask"] for e in elements])
    element_id = np.concatenate([np.full(len(e["tokens"]), i) for i, e in enumerate(elements)])
    num_rows = -(-len(tokens) // row_length)
    pad = num_rows * row_length - len(tokens)
    tokens, masks = np.pad(tokens, (0, pad)), np.pad(masks, (0, pad))
    element_id = np.pad(element_id, (0, pad), constant_values=-1).reshape(num_rows, row_length)
    starts = np.ones_like(element_id, dtype=bool)
    starts[:, 1:] = element_id[:, 1:] != element_id[:, :-1]
    segments = np.where(element_id >= 0, np.cumsum(starts, axis=1), 0)
    index = np.broadcast_to(np.arange(row_length), element_id.shape)
    piece_start = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    positions = np.where(element_id >= 0, index - piece_start, 0)
    return (tokens.reshape(num_rows, row_length), masks.reshape(num_rows, row_length),
            segments, positions)


LENGTHS = [5, 1, 30, 0, 12, 13, 2, 40, 7, 3, 11]


@pytest.mark.parametrize("answers_only", [False, True])
def test_packed_examples_match_the_vectorised_reference(answers_only):
    elements = make_elements(LENGTHS, answers_only=answers_only)
    examples = list(pack_examples(as_stream(elements), seq_len=SEQ_LEN))
    tokens, masks, segments, positions = reference_rows(elements, SEQ_LEN + 1)
    assert len(examples) == len(tokens)
    for row, example in enumerate(examples):
        assert sorted(example) == sorted(FIELDS)
        np.testing.assert_array_equal(example["inputs"], tokens[row, :-1])
        np.testing.assert_array_equal(example["targets"], tokens[row, 1:])
        np.testing.assert_array_equal(example["segment_ids"], segments[row, :-1])
        np.testing.assert_array_equal(example["positions"], positions[row, :-1])
        same = (segments[row, 1:] == segments[row, :-1]) & (segments[row, :-1] > 0)
        np.testing.assert_array_equal(example["loss_mask"], masks[row, 1:] * same)


def test_packing_invariants_hold_row_by_row():
    elements = make_elements(LENGTHS, seed=1, answers_only=True)
    examples = list(pack_examples(as_stream(elements), seq_len=SEQ_LEN))
    for example in examples:
        inputs, targets = example["inputs"], example["targets"]
        segments, positions, loss_mask = example["segment_ids"], example["positions"], example["loss_mask"]
        assert inputs.dtype == targets.dtype == segments.dtype == positions.dtype == np.int32
        assert loss_mask.dtype == np.float32
        np.testing.assert_array_equal(targets[:-1], inputs[1:])  # targets are inputs shifted by one
        real = segments > 0
        assert segments[0] == 1 and np.all(np.diff(segments[real]) >= 0)
        assert np.all(np.diff(segments[real]) <= 1)
        assert not np.any(real[1:] & ~real[:-1]), "padding must be a suffix of the row"
        new_piece = np.r_[True, segments[1:] != segments[:-1]] & real
        np.testing.assert_array_equal(positions[new_piece], 0)
        continuing = np.flatnonzero(real & ~new_piece)
        np.testing.assert_array_equal(positions[continuing], positions[continuing - 1] + 1)
        boundary = np.r_[segments[1:] != segments[:-1], True]  # the target leaves the segment (or row)
        assert np.all(loss_mask[~real] == 0)
        assert np.all(loss_mask[:-1][boundary[:-1]] == 0)


def test_every_token_of_the_stream_appears_once_in_order():
    elements = make_elements(LENGTHS, seed=2)
    examples = list(pack_examples(as_stream(elements), seq_len=SEQ_LEN))
    rows = np.concatenate([np.r_[e["inputs"], e["targets"][-1]] for e in examples])
    stream = np.concatenate([e["tokens"] for e in elements])
    np.testing.assert_array_equal(rows[: len(stream)], stream)
    assert len(rows) - len(stream) < SEQ_LEN + 1 and not rows[len(stream):].any()


def test_restoring_any_saved_state_replays_the_same_rows():
    elements = make_elements(LENGTHS, seed=3)
    dataset = pack_examples(as_stream(elements), seq_len=SEQ_LEN)
    expected = list(dataset)
    for start in range(len(expected)):
        iterator = iter(dataset)
        for _ in range(start):
            next(iterator)
        state = json.loads(json.dumps(iterator.get_state()))  # as grain's orbax handler stores it
        resumed = iter(dataset)
        resumed.set_state(state)
        rest = list(resumed)
        assert len(rest) == len(expected) - start
        for got, want in zip(rest, expected[start:]):
            for field in FIELDS:
                np.testing.assert_array_equal(got[field], want[field])


def test_batches_stack_rows_and_pad_batch_adds_masked_rows():
    elements = make_elements(LENGTHS, seed=4)
    batches = list(pack_and_batch(as_stream(elements), seq_len=SEQ_LEN, batch_size=4,
                                  drop_remainder=False))
    num_rows = -(-sum(LENGTHS) // (SEQ_LEN + 1))
    assert num_rows % 4, "the last batch must be partial for this test"
    assert [b["inputs"].shape[0] for b in batches] == [4] * (num_rows // 4) + [num_rows % 4]
    padded = pad_batch(batches[-1], 4)
    rows = batches[-1]["inputs"].shape[0]
    for field in FIELDS:
        assert padded[field].shape == (4, SEQ_LEN) and padded[field].dtype == batches[-1][field].dtype
        np.testing.assert_array_equal(padded[field][:rows], batches[-1][field])
        assert not padded[field][rows:].any()


def test_malformed_elements_are_rejected_with_their_keys_and_shapes():
    with pytest.raises(ValueError, match=r"keys \['loss_mask', 'tokens'\], got \['tokens'\]"):
        list(pack_examples(as_stream([{"tokens": np.ones(3, np.int32)}]), seq_len=4))
    bad_mask = {"tokens": np.ones(3, np.int32), "loss_mask": np.ones(2, np.float32)}
    with pytest.raises(ValueError, match=r"loss_mask.*\(3,\), got \(2,\)"):
        list(pack_examples(as_stream([bad_mask]), seq_len=4))
    with pytest.raises(ValueError, match="seq_len must be an int >= 1"):
        pack_examples(as_stream([]), seq_len=0)
