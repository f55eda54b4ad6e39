"""ByteTokenizer: ids are UTF-8 bytes, 256 = BOS, 257 = EOS."""

import numpy as np
import pytest

from seqmodels.data.tokenizers import BOS_ID, EOS_ID, ByteTokenizer, get_tokenizer

TEXTS = ["", "def f(x):\n    return x\n", "naïve café — ∑ 🙂", "\x00\x7f tabs\t"]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_inverts_encode(text):
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_vocabulary_is_bytes_plus_bos_and_eos():
    tokenizer = get_tokenizer("byte")
    assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id) == (258, BOS_ID, EOS_ID)
    assert (BOS_ID, EOS_ID) == (256, 257)


def test_decode_skips_specials_and_replaces_broken_utf8():
    tokenizer = ByteTokenizer()
    euro = list("€".encode())  # three bytes
    assert tokenizer.decode([BOS_ID, 104, 105, EOS_ID]) == "hi"
    assert tokenizer.decode([BOS_ID, *euro[:2], EOS_ID]) == "\ufffd"


def test_decode_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 258\)"):
        ByteTokenizer().decode([65, 258])
    with pytest.raises(ValueError, match="1-D"):
        ByteTokenizer().decode(np.zeros((2, 2), np.int32))


def test_unknown_tokenizer_names_the_config_key():
    with pytest.raises(ValueError, match="data.tokenizer.*'gpt9'.*byte"):
        get_tokenizer("gpt9")
