"""experiments/ahn/long_documents.py: keeps the documents of at least --min-chars, every split, and never
overwrites an earlier output."""

import json

import pytest

from experiments.ahn import long_documents

SPLITS = ("train", "validation", "test")


def write_corpus(directory, lengths):
    directory.mkdir()
    for split in SPLITS:
        lines = [json.dumps({"name": f"{split}-{i}", "text": "x" * n}) for i, n in enumerate(lengths)]
        (directory / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


def test_keeps_the_long_documents_of_every_split_in_order(tmp_path):
    write_corpus(tmp_path / "corpus", [5, 30, 10, 29, 31])
    out = tmp_path / "long"
    assert long_documents.main(["--input", str(tmp_path / "corpus"), "--min-chars", "29", "--out", str(out)]) == 0
    for split in SPLITS:
        names = [json.loads(line)["name"] for line in (out / f"{split}.jsonl").read_text().splitlines()]
        assert names == [f"{split}-1", f"{split}-3", f"{split}-4"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["documents"] == 3 and manifest["splits"]["train"]["of"] == 5
    assert manifest["splits"]["validation"]["characters"] == 90


def test_an_existing_output_is_refused_and_left_as_it_was(tmp_path):
    write_corpus(tmp_path / "corpus", [40])
    out = tmp_path / "long"
    out.mkdir()
    (out / "validation.jsonl").write_text("keep me\n")
    with pytest.raises(SystemExit, match="validation.jsonl already exist"):
        long_documents.main(["--input", str(tmp_path / "corpus"), "--out", str(out)])
    assert (out / "validation.jsonl").read_text() == "keep me\n"
    assert not (out / "train.jsonl").exists()


def test_a_missing_split_or_a_line_without_text_names_the_file(tmp_path):
    with pytest.raises(SystemExit, match="missing .*train.jsonl"):
        long_documents.main(["--input", str(tmp_path), "--out", str(tmp_path / "long")])
    write_corpus(tmp_path / "corpus", [40])
    (tmp_path / "corpus" / "test.jsonl").write_text('{"title": "no text"}\n')
    with pytest.raises(SystemExit, match=r"test.jsonl:1: not a JSON object with a 'text' field"):
        long_documents.main(["--input", str(tmp_path / "corpus"), "--out", str(tmp_path / "long")])
