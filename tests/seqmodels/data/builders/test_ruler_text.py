"""python -m seqmodels.data.builders.ruler_text: the ruler source's training rows as text, deterministic, no
overwrite, and a tokenizer trained on it shortens the task's rows."""

import json

from seqmodels.data.builders.ruler_text import main, ruler_texts
from seqmodels.data.builders.tokenizer import train_bpe
from seqmodels.data.ruler_tasks import TASKS
from seqmodels.data.tokenizers import get_tokenizer


def test_the_text_is_each_rows_prompt_and_answer_and_the_same_for_the_same_seed(tmp_path):
    out = tmp_path / "text" / "rows.jsonl"
    assert main(["--tasks", "niah_single_1", "--rows", "40", "--length", "512", "--out", str(out)]) == 0
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    assert len(texts) == 40 and texts == ruler_texts(["niah_single_1"], 40, 512)
    assert ruler_texts(["niah_single_1"], 40, 512, seed=1) != texts
    for text in texts:
        # the template's opening, its question, and the answer: the needle's value once in the haystack, once after
        assert text.startswith("A special magic number is hidden") and "What is the special magic number" in text
        value = text.rsplit(" ", 1)[-1].rstrip(".")
        assert value.isdigit() and text.count(value) == 2, text
        assert len(text.encode()) < 512  # the row's bytes less its opening and end-of-document tokens and padding
    assert len(set(texts)) == 40
    # a 512-token BPE of the task's own text takes over 3 times fewer tokens per row than bytes (measured: 3.76)
    tokenizer = get_tokenizer(f"hf:{train_bpe(str(out), 512, str(tmp_path / 'tokenizer'))}")
    assert sum(len(tokenizer.encode(text)) for text in texts) * 3 < sum(len(text.encode()) for text in texts)


def test_refuses_an_existing_file_an_unknown_task_and_rows_too_short(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    out.write_text("mine\n")
    assert main(["--tasks", "niah_single_1", "--rows", "2", "--length", "512", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "mine\n"
    other = tmp_path / "other.jsonl"
    assert main(["--tasks", "niah_nowhere", "--rows", "2", "--length", "512", "--out", str(other)]) == 2
    assert "niah_nowhere" in capsys.readouterr().err
    assert main(["--tasks", "niah_single_1", "--rows", "2", "--length", "64", "--out", str(other)]) == 2
    assert "data.seq_len=63" in capsys.readouterr().err
    assert main(["--tasks", "niah_single_1", "--rows", "0", "--length", "512", "--out", str(other)]) == 2
    assert "--rows" in capsys.readouterr().err and not other.exists()
    assert "niah_single_1" in TASKS
