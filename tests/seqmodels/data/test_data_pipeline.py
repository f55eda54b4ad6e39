"""Training and evaluation pipelines: format, order, sharding, split, exact resume, orbax."""

import json

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from seqmodels.config import DataConfig
from seqmodels.data import (BOS_ID, EOS_ID, FIELDS, DataError, describe_source, load_documents,
                            make_eval_batches, make_train_dataset)
from seqmodels.data.heldout_sample import sample_order
from seqmodels.data.pipeline import train_document_stream

SEQ_LEN, BATCH = 16, 4


@pytest.fixture
def small_corpus(tmp_path):
    """12 documents of 20-200 bytes with unique contents; 4 of them held out."""
    rng = np.random.default_rng(0)
    for i in range(12):
        body = "".join(rng.choice(list("abcdefgh é\n"), size=int(rng.integers(20, 200))))
        (tmp_path / f"doc{i:02d}.txt").write_text(f"<{i:02d}>{body}", encoding="utf-8")
    return DataConfig(source="text_files", path=str(tmp_path / "*.txt"), seq_len=SEQ_LEN,
                      heldout_fraction=0.4, seed=7)


def take(iterator, count):
    return [next(iterator) for _ in range(count)]


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for field in FIELDS:
            assert g[field].dtype == w[field].dtype
            np.testing.assert_array_equal(g[field], w[field])


def documents_in(batches):
    """The complete documents (BOS ... EOS) of a stream of rows, as texts, in order."""
    rows = [np.r_[b["inputs"][r], b["targets"][r, -1]] for b in batches for r in range(len(b["inputs"]))]
    stream = np.concatenate(rows)
    assert stream[0] == BOS_ID
    pieces = np.split(stream, np.flatnonzero(stream == BOS_ID)[1:])  # each from one BOS to the next
    ends = [np.flatnonzero(p == EOS_ID) for p in pieces]  # padding may follow the last EOS
    return [bytes(p[1:e[0]].astype(np.uint8)).decode("utf-8") for p, e in zip(pieces, ends) if e.size]


def all_texts(documents):
    return [documents[i] for i in range(len(documents))]


def test_train_batches_have_the_documented_format():
    cfg = DataConfig(seq_len=SEQ_LEN)
    batch = next(iter(make_train_dataset(cfg, batch_size=BATCH)))
    assert sorted(batch) == sorted(FIELDS)
    for field in FIELDS:
        assert batch[field].shape == (BATCH, SEQ_LEN)
        assert batch[field].dtype == (np.float32 if field == "loss_mask" else np.int32)
    assert batch["inputs"].max() < 258 and batch["inputs"].min() >= 0
    assert set(np.unique(batch["loss_mask"])) <= {0.0, 1.0}
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])
    assert np.all(batch["segment_ids"] >= 1), "infinite training rows are never padded"


def test_each_epoch_is_a_new_permutation_of_the_training_documents(small_corpus):
    train = all_texts(load_documents(small_corpus).train)
    batches = take(iter(make_train_dataset(small_corpus, batch_size=BATCH)), 60)
    seen = documents_in(batches)
    first, second = seen[: len(train)], seen[len(train): 2 * len(train)]
    assert len(second) == len(train)
    assert sorted(first) == sorted(train) and sorted(second) == sorted(train)
    assert first != second and first != train


def test_order_is_fixed_by_the_seed(small_corpus):
    first = take(iter(make_train_dataset(small_corpus, batch_size=BATCH)), 5)
    again = take(iter(make_train_dataset(small_corpus, batch_size=BATCH)), 5)
    other = take(iter(make_train_dataset(DataConfig(**{**small_corpus.__dict__, "seed": 8}),
                                         batch_size=BATCH)), 5)
    assert_same_batches(again, first)
    assert not np.array_equal(np.stack([b["inputs"] for b in other]), np.stack([b["inputs"] for b in first]))


def test_processes_read_disjoint_documents_covering_each_epoch():
    num_documents, process_count = 101, 3
    per_process = [list(train_document_stream(list(range(num_documents)), seed=0, process_index=p,
                                              process_count=process_count)[: -(-(num_documents - p) // 3)])
                   for p in range(process_count)]
    sets = [set(s) for s in per_process]
    assert sum(len(s) for s in sets) == num_documents and set().union(*sets) == set(range(num_documents))


def test_two_processes_train_on_disjoint_documents(small_corpus):
    train = all_texts(load_documents(small_corpus).train)
    streams = [documents_in(take(iter(make_train_dataset(small_corpus, batch_size=BATCH, process_index=p,
                                                         process_count=2)), 20)) for p in range(2)]
    first_epoch = [streams[0][: -(-len(train) // 2)], streams[1][: len(train) // 2]]
    assert set(first_epoch[0]).isdisjoint(first_epoch[1])
    assert sorted(first_epoch[0] + first_epoch[1]) == sorted(train)


def test_heldout_documents_are_disjoint_from_train_and_are_what_eval_reads(small_corpus):
    split = load_documents(small_corpus)
    assert set(split.train.identities).isdisjoint(split.heldout.identities)
    assert len(split.heldout) >= 1
    batches = make_eval_batches(small_corpus, batch_size=BATCH, max_batches=50)
    assert_same_batches(make_eval_batches(small_corpus, batch_size=BATCH, max_batches=50), batches)
    # The held-out sample: every held-out document once, its first SEQ_LEN + 1 tokens, in the seeded order.
    order = sample_order(len(split.heldout), small_corpus.heldout_seed)
    want = [np.r_[BOS_ID, np.frombuffer(split.heldout[int(i)].encode(), np.uint8).astype(int), EOS_ID][:SEQ_LEN + 1]
            for i in order]
    rows = [np.r_[b["inputs"][r], b["targets"][r, -1]] for b in batches for r in range(len(b["inputs"]))]
    stream = np.concatenate(rows)
    np.testing.assert_array_equal(stream[:sum(w.size for w in want)], np.concatenate(want))
    assert list(order) != sorted(order)  # not corpus order


def test_eval_pads_the_last_batch_with_masked_rows_and_caps_the_count(small_corpus):
    batches = make_eval_batches(small_corpus, batch_size=BATCH, max_batches=50)
    assert len(batches) < 50
    last = batches[-1]
    for batch in batches:
        assert all(batch[f].shape == (BATCH, SEQ_LEN) for f in FIELDS)
    padding_rows = last["segment_ids"][:, 0] == 0
    assert not any(last[f][padding_rows].any() for f in FIELDS)
    capped = make_eval_batches(DataConfig(seq_len=SEQ_LEN), batch_size=2, max_batches=3)
    assert len(capped) == 3 and all(b["loss_mask"].sum() > 0 for b in capped)


def test_eval_without_heldout_documents_names_the_key(tmp_path):
    (tmp_path / "only.txt").write_text("one document")
    cfg = DataConfig(source="text_files", path=str(tmp_path / "*.txt"))
    with pytest.raises(DataError, match="data.heldout_fraction=0.02: no held-out documents"):
        make_eval_batches(cfg, batch_size=2, max_batches=1)


@pytest.mark.parametrize("skip, prefetch_batches", [(0, 0), (7, 0), (7, 3)])
def test_resuming_from_a_saved_state_replays_the_same_batches_bitwise(skip, prefetch_batches):
    def batches():
        return make_train_dataset(DataConfig(seq_len=64, seed=3), batch_size=BATCH,
                                  prefetch_batches=prefetch_batches)

    iterator = iter(batches())
    take(iterator, skip)
    state = json.loads(json.dumps(iterator.get_state()))
    expected = take(iterator, 5)
    resumed = iter(batches())
    resumed.set_state(state)
    assert_same_batches(take(resumed, 5), expected)


def test_orbax_checkpoint_manager_round_trips_the_iterator_state(tmp_path, small_corpus):
    iterator = iter(make_train_dataset(small_corpus, batch_size=BATCH))
    take(iterator, 9)
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
    params = {"w": np.arange(6, dtype=np.float32)}
    with ocp.CheckpointManager(tmp_path / "ckpt", options=options) as manager:
        manager.save(9, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                data=grain.checkpoint.CheckpointSave(iterator)))
        expected = take(iterator, 6)  # advancing during the asynchronous save must not leak in
        manager.wait_until_finished()
    fresh = iter(make_train_dataset(small_corpus, batch_size=BATCH))
    with ocp.CheckpointManager(tmp_path / "ckpt", options=options) as manager:
        assert manager.latest_step() == 9
        restored = manager.restore(9, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(params), data=grain.checkpoint.CheckpointRestore(fresh)))
    np.testing.assert_array_equal(restored["params"]["w"], params["w"])
    assert restored["data"] is fresh
    assert_same_batches(take(fresh, 6), expected)


def test_describe_source_reports_counts_and_size():
    cfg = DataConfig()
    split = load_documents(cfg)
    line = describe_source(cfg)
    assert line.startswith("data: stdlib (") and "\n" not in line
    assert f"{len(split.train)} train / {len(split.heldout)} held-out documents" in line
    assert line.endswith(f", {split.train.num_bytes + split.heldout.num_bytes:,} bytes")


def test_invalid_batching_arguments_are_named():
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        make_train_dataset(DataConfig(), batch_size=0)
    with pytest.raises(ValueError, match=r"process_index must be an int in \[0, 2\), got 2"):
        make_train_dataset(DataConfig(), batch_size=1, process_index=2, process_count=2)
    with pytest.raises(ValueError, match="prefetch_batches must be an int >= 0, got -1"):
        make_train_dataset(DataConfig(), batch_size=1, prefetch_batches=-1)
    with pytest.raises(ValueError, match="max_batches must be an int >= 1"):
        make_eval_batches(DataConfig(), batch_size=1, max_batches=0)
