"""Document sources, the held-out split, and errors that name the config key."""

import builtins
import os
import sysconfig

import numpy as np
import pytest

from seqmodels.config import DataConfig
from seqmodels.data.builders.prepare import main as prepare_main
from seqmodels.data.document_split import load_documents, split_indices
from seqmodels.data.errors import DataError
from seqmodels.data.sources.text_documents import stdlib_documents


def write_files(root, contents):
    """``contents``: relative path -> text. Returns the paths written."""
    paths = []
    for relative, text in contents.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def test_stdlib_lists_sorted_nonempty_python_files_without_reading_them(monkeypatch):
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    documents = stdlib_documents()
    assert opened == [], "listing must not read documents"
    monkeypatch.undo()
    root = sysconfig.get_paths()["stdlib"]
    assert len(documents) > 500
    assert list(documents.identities) == sorted(documents.identities)
    assert all(p.endswith(".py") and p.startswith(root) for p in documents.paths)
    assert not any("site-packages" in p.split(os.sep) for p in documents.paths)
    assert min(documents.sizes) > 0
    index = documents.identities.index("json/decoder.py")
    assert "class JSONDecoder" in documents[index]


def test_split_is_disjoint_stable_and_about_the_requested_fraction():
    identities = [f"doc{i}.txt" for i in range(2000)]
    train, heldout = split_indices(identities, 0.1)
    assert set(train).isdisjoint(heldout) and len(train) + len(heldout) == 2000
    assert 140 <= len(heldout) <= 260  # binomial(2000, 0.1): mean 200, std 13.4
    # A document's side does not depend on which other documents exist.
    heldout_names = {identities[i] for i in heldout}
    subset = identities[::3]
    _, subset_heldout = split_indices(subset, 0.1)
    assert {subset[i] for i in subset_heldout} == heldout_names & set(subset)


def test_split_of_two_documents_keeps_one_on_each_side():
    train, heldout = split_indices(["a", "b"], 0.001)
    assert len(train) == 1 and len(heldout) == 1
    train, heldout = split_indices(["a", "b"], 0.999)
    assert len(train) == 1 and len(heldout) == 1


def test_text_files_glob_recurses_skips_empty_files_and_caps(tmp_path):
    write_files(tmp_path, {"b.txt": "bee", "a/x.txt": "ex", "a/deep/y.txt": "why", "empty.txt": "",
                           "skip.md": "not matched"})
    cfg = DataConfig(source="text_files", path=str(tmp_path / "**" / "*.txt"), heldout_fraction=0.3)
    split = load_documents(cfg)
    identities = sorted(split.train.identities + split.heldout.identities)
    assert identities == ["a/deep/y.txt", "a/x.txt", "b.txt"]
    texts = {i: d for docs in (split.train, split.heldout) for i, d in zip(docs.identities, docs)}
    assert texts == {"a/deep/y.txt": "why", "a/x.txt": "ex", "b.txt": "bee"}
    capped = load_documents(DataConfig(source="text_files", path=cfg.path, max_documents=2))
    assert sorted(capped.train.identities + capped.heldout.identities) == ["a/deep/y.txt", "a/x.txt"]


def test_empty_glob_names_data_path(tmp_path):
    pattern = str(tmp_path / "*.nothing")
    with pytest.raises(DataError, match=r"data\.path=.*\*\.nothing.*no file matches"):
        load_documents(DataConfig(source="text_files", path=pattern))
    assert issubclass(DataError, ValueError)


def test_all_empty_documents_name_data_path(tmp_path):
    write_files(tmp_path, {"a.txt": "", "b.txt": ""})
    with pytest.raises(DataError, match=r"data\.path=.*all 2 matching files are empty"):
        load_documents(DataConfig(source="text_files", path=str(tmp_path / "*.txt")))


def test_unreadable_shard_names_data_path_and_the_shard(tmp_path):
    (tmp_path / "broken.array_record").write_bytes(b"not an array record" * 10)
    with pytest.raises(DataError, match=r"data\.path=.*broken\.array_record is not a readable"):
        load_documents(DataConfig(source="arrayrecord", path=str(tmp_path / "*.array_record")))
    with pytest.raises(DataError, match=r"data\.path=.*no shard matches.*seqmodels\.data\.builders\.prepare"):
        load_documents(DataConfig(source="arrayrecord", path=str(tmp_path / "*.none")))


def test_prepared_shards_read_back_as_the_same_documents(tmp_path, capsys):
    texts = {f"in/d{i:02d}.txt": f"document {i}: " + "é∑🙂" * i for i in range(7)}
    write_files(tmp_path, {**texts, "in/empty.txt": ""})
    argv = ["--input", str(tmp_path / "in" / "*.txt"), "--output", str(tmp_path / "out"), "--shards", "3"]
    assert prepare_main(argv) == 0
    assert "wrote 3 shards" in capsys.readouterr().out
    assert len(list((tmp_path / "out").glob("*.array_record"))) == 3
    cfg = DataConfig(source="arrayrecord", path=str(tmp_path / "out" / "*.array_record"),
                     heldout_fraction=0.2)
    split = load_documents(cfg)
    by_index = {int(i.split(":")[1]): d for docs in (split.train, split.heldout)
                for i, d in zip(docs.identities, docs)}
    assert [by_index[k] for k in range(len(by_index))] == [texts[k] for k in sorted(texts)]
    assert split.train.num_bytes > 0 and len(split.heldout) >= 1
    assert prepare_main(argv) == 2, "writing into a directory that already holds shards must fail"
    assert "already holds shards" in capsys.readouterr().err
