"""The byte-level tokenizer in Hugging Face form: ``AutoTokenizer`` gives ``ByteTokenizer``'s ids exactly.

The Hugging Face tokenizer takes text (``str``; Python ``str`` cannot hold bytes that are not UTF-8, and the
``tokenizers`` library takes no ``bytes``), so encoding is tested over arbitrary text (every Unicode plane,
controls, the special tokens' own spellings) and decoding over arbitrary id sequences, invalid UTF-8
included, against ``ByteTokenizer.decode`` (both replace an invalid sequence with U+FFFD).
"""

import numpy as np
import pytest

from seqmodels.data.hf_tokenizer import load_tokenizer, write_byte_level_tokenizer
from seqmodels.data.tokenizers import ByteTokenizer


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    from transformers import AutoTokenizer
    directory = tmp_path_factory.mktemp("byte_level")
    write_byte_level_tokenizer(directory, bos_id=ByteTokenizer.bos_id, eos_id=ByteTokenizer.eos_id)
    return directory, AutoTokenizer.from_pretrained(directory)


def _random_texts(rng, count: int) -> list[str]:
    """Random strings of code points from every plane (no surrogates), plus hand-picked hard cases."""
    texts = ["", " ", "  leading and trailing  ", "<bos>", "<eos><bos>", "a<bos>b", "\x00\x01\x7f\x80",
             "\r\n\t\x0b\x0c", "Ġ ĉ Ċ", "naïve café", "漢字かな", "\U0001f600\U0001f44d\U0010ffff", "e\u0301"]
    for _ in range(count):
        points = rng.integers(0, 0x110000, size=int(rng.integers(1, 40)))
        texts.append("".join(chr(p) for p in points if not 0xD800 <= p < 0xE000))
    return texts


def test_encoding_any_text_gives_the_byte_tokenizers_ids_and_decodes_back(byte_level):
    _, tokenizer = byte_level
    project = ByteTokenizer()
    for text in _random_texts(np.random.default_rng(0), 300):
        ids = project.encode(text).tolist()
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids, repr(text)
        assert tokenizer(text)["input_ids"] == [project.bos_id, *ids], repr(text)  # BOS opens a document
        assert tokenizer.decode([project.bos_id, *ids, project.eos_id], skip_special_tokens=True) == text, repr(text)


def test_decoding_any_byte_sequence_matches_the_byte_tokenizer_invalid_utf8_included(byte_level):
    _, tokenizer = byte_level
    project, rng = ByteTokenizer(), np.random.default_rng(1)
    sequences = [list(b"\xff\xfe"), list(b"\xc3"), list(b"abc\xe2\x82"), list(b"\xed\xa0\x80"), list(range(256))]
    sequences += [rng.integers(0, 256, size=int(rng.integers(1, 64))).tolist() for _ in range(300)]
    invalid = 0
    for ids in sequences:
        try:
            bytes(ids).decode("utf-8")
        except UnicodeDecodeError:
            invalid += 1
        assert tokenizer.decode(ids) == project.decode(ids), ids
    assert invalid > 250  # random bytes are mostly not UTF-8: the replacement path is what is measured


def test_every_id_is_one_token_and_the_special_ids_are_the_projects(byte_level):
    directory, tokenizer = byte_level
    assert len(tokenizer) == ByteTokenizer.vocab_size
    tokens = tokenizer.convert_ids_to_tokens(list(range(ByteTokenizer.vocab_size)))
    assert len(set(tokens)) == ByteTokenizer.vocab_size
    assert tokenizer.convert_tokens_to_ids(tokens) == list(range(ByteTokenizer.vocab_size))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (256, 257, 257)
    loaded = load_tokenizer(directory)  # the project's own reader of a Hugging Face directory agrees
    assert (loaded.vocab_size, loaded.bos_id, loaded.eos_id) == (258, 256, 257)
    assert loaded.encode("héllo") == ByteTokenizer().encode("héllo").tolist()


def test_a_padded_batch_pads_with_eos_and_masks_it(byte_level):
    _, tokenizer = byte_level
    batch = tokenizer(["hi", "hello"], padding=True, return_tensors="np")
    assert batch["input_ids"].tolist() == [[256, 104, 105, 257, 257, 257], [256, 104, 101, 108, 108, 111]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]


def test_ids_other_than_256_and_257_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must be 256 and 257"):
        write_byte_level_tokenizer(tmp_path, bos_id=1, eos_id=2)
