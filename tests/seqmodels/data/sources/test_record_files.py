"""The jsonl and parquet sources (data.text_field) and data.heldout_path."""

import json

import pytest

from seqmodels.config import ConfigError, DataConfig
from seqmodels.data import DataError, load_documents, make_eval_batches, make_train_dataset

TEXTS = [f"document number {i}: " + "words " * (i % 7 + 1) for i in range(30)]


def _jsonl(path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" + ("\n" if i % 5 == 0 else "")
                            for i, t in enumerate(texts)))
    return str(path)


def _parquet(path, texts, field="content"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({field: texts, "id": list(range(len(texts)))}), str(path), row_group_size=7)
    return str(path)


def test_jsonl_reads_every_line_s_text_field_in_order(tmp_path):
    path = _jsonl(tmp_path / "a.jsonl", TEXTS)
    split = load_documents(DataConfig(source="jsonl", path=path, heldout_fraction=0.2))
    assert sorted(list(split.train) + list(split.heldout)) == sorted(TEXTS)
    assert len(split.heldout) and len(split.train)
    assert split.heldout.identities[0].startswith("a.jsonl:")


def test_parquet_reads_the_named_column_across_row_groups(tmp_path):
    path = _parquet(tmp_path / "a.parquet", TEXTS)
    split = load_documents(DataConfig(source="parquet", path=path, text_field="content", heldout_path=path))
    assert list(split.train) == TEXTS and list(split.heldout) == TEXTS
    with pytest.raises(DataError, match="no column data.text_field='text'; its columns: content, id"):
        load_documents(DataConfig(source="parquet", path=path))


def test_heldout_path_replaces_the_hash_split(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", TEXTS[:20])
    heldout = _jsonl(tmp_path / "validation.jsonl", TEXTS[20:])
    split = load_documents(DataConfig(source="jsonl", path=train, heldout_path=heldout))
    assert list(split.train) == TEXTS[:20] and list(split.heldout) == TEXTS[20:]
    batches = make_eval_batches(DataConfig(source="jsonl", path=train, heldout_path=heldout, seq_len=16),
                                batch_size=2, max_batches=50)
    # Every held-out document, [BOS] text [EOS] cut to one row of seq_len + 1 tokens (the held-out sample)
    heldout_tokens = sum(min(len(t.encode()) + 2, 17) for t in TEXTS[20:])
    assert sum(int((b["segment_ids"] > 0).sum()) for b in batches) >= heldout_tokens - len(batches) * 2
    assert {int(d) for b in batches for d in b["documents"][b["documents"] >= 0]} == set(range(len(TEXTS[20:])))
    batch = next(iter(make_train_dataset(DataConfig(source="jsonl", path=train, seq_len=16), batch_size=2)))
    assert batch["inputs"].shape == (2, 16)


def test_a_record_without_the_field_names_file_row_and_key(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    documents = load_documents(DataConfig(source="jsonl", path=str(path), heldout_path=str(path))).train
    assert documents[0] == "fine"
    with pytest.raises(DataError, match="bad.jsonl row 1: data.text_field='text' is missing"):
        documents[1]


def test_jsonl_needs_a_path_and_a_matching_file(tmp_path):
    with pytest.raises(ConfigError, match="data.path"):
        load_documents(DataConfig(source="jsonl"))
    with pytest.raises(DataError, match="no file matches"):
        load_documents(DataConfig(source="jsonl", path=str(tmp_path / "none*.jsonl")))
    with pytest.raises(ConfigError, match="data.text_field"):
        DataConfig(source="jsonl", text_field="")
