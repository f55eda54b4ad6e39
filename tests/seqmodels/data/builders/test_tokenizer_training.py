"""python -m seqmodels.data.builders.tokenizer train: deterministic byte-level BPE, round trip, hf:DIR loading."""

import json

import pytest

from seqmodels.data.builders.files import iter_texts
from seqmodels.data.builders.tokenizer import main, train_bpe
from seqmodels.data.tokenizers import get_tokenizer

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Émile's naïve café — 東京 🦊\ttabs\n\nnew lines",
         "def f(x):\n    return x ** 2  # squares\n"] * 20


def _corpus(directory):
    directory.mkdir()
    (directory / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (directory / "validation.jsonl").write_text(json.dumps({"text": "never seen zyzzyva"}) + "\n")
    return str(directory)


def test_training_is_deterministic_and_round_trips(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    assert main(["train", "--input", corpus, "--vocab-size", "300", "--out", str(tmp_path / "a")]) == 0
    assert main(["train", "--input", corpus, "--vocab-size", "300", "--out", str(tmp_path / "b")]) == 0
    first, second = (tmp_path / "a" / "tokenizer.json").read_bytes(), (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert first == second
    tokenizer = get_tokenizer(f"hf:{tmp_path / 'a'}")
    assert tokenizer.vocab_size == 300
    for text in TEXTS[:3] + ["unseen: zyzzyva ⊕ ∮ 🦀", ""]:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode(TEXTS[0])) < len(TEXTS[0].encode()) / 2  # merges learned
    assert tokenizer.document_ids() == (0, 0)  # <|endoftext|> opens and closes documents
    training = json.loads((tmp_path / "a" / "training.json").read_text())
    assert [entry["path"].rsplit("/", 1)[1] for entry in training["inputs"]] == ["train.jsonl"]


def test_refuses_to_overwrite_and_bad_inputs(tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus")
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_text("mine")
    assert main(["train", "--input", corpus, "--vocab-size", "300", "--out", str(out)]) == 2
    assert "already holds tokenizer.json" in capsys.readouterr().err
    assert (out / "tokenizer.json").read_text() == "mine"
    with pytest.raises(ValueError, match="--vocab-size"):
        train_bpe(corpus, 100, str(tmp_path / "x"))
    with pytest.raises(ValueError, match="no such directory, and no file matches"):
        train_bpe(str(tmp_path / "missing"), 300, str(tmp_path / "x"))
    with pytest.raises(ValueError, match="no string field 'body'"):
        list(iter_texts([corpus + "/train.jsonl"], "body"))


def test_split_digits_gives_every_digit_a_token_of_its_own_and_still_round_trips(tmp_path):
    numbers = [f"The value for key-{i} is: {4297058 + 7919 * i}. It was 1999 and 2024 then." for i in range(200)]
    corpus = tmp_path / "numbers.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in numbers))
    split = get_tokenizer(f"hf:{train_bpe(str(corpus), 400, str(tmp_path / 'split'), split_digits=True)}")
    merged = get_tokenizer(f"hf:{train_bpe(str(corpus), 400, str(tmp_path / 'merged'))}")
    text = "is: 4297058. In 2024, 31 of 1999."
    pieces = [split.decode([i]) for i in split.encode(text)]
    digit_pieces = [piece for piece in pieces if any(c.isdigit() for c in piece)]
    assert "".join(digit_pieces) == "4297058202431" + "1999" and all(len(piece) == 1 for piece in digit_pieces)
    merged_pieces = [merged.decode([i]).strip() for i in merged.encode(text)]
    assert any(len(piece) > 1 and piece.isdigit() for piece in merged_pieces)  # the default merges digits
    for tokenizer in (split, merged):
        assert tokenizer.decode(tokenizer.encode(text)) == text
    training = json.loads((tmp_path / "split" / "training.json").read_text())
    assert training["split_digits"] is True
    assert json.loads((tmp_path / "merged" / "training.json").read_text())["split_digits"] is False
    assert main(["train", "--input", str(corpus), "--vocab-size", "400", "--split-digits",
                 "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (tmp_path / "split" / "tokenizer.json").read_bytes()
    with pytest.raises(ValueError, match="split_digits must be a bool"):
        train_bpe(str(corpus), 400, str(tmp_path / "x"), split_digits="yes")
