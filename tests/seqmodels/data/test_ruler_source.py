"""The ``ruler`` data source (seqmodels/data/sources/ruler.py): RULER's format as training rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seqmodels.config import ConfigError
from seqmodels.config_io import load_config
from seqmodels.data.pipeline import make_eval_batches
from seqmodels.data.ruler_tasks import answer_text
from seqmodels.data.sources.ruler import check_ruler, ruler_element, ruler_train_dataset
from seqmodels.data.tokenizers import get_tokenizer


def data_config(**changes):
    values = {"data.source": "ruler", "data.seq_len": 399, "data.ruler_tasks": "[niah_single_1, niah_single_2]"}
    values.update({key.replace("__", "."): value for key, value in changes.items()})
    return load_config(None, [f"{key}={value}" for key, value in values.items()]).data


def test_a_row_is_the_prompt_then_the_answer_and_end_of_document_with_loss_on_those_alone():
    cfg = data_config()
    tokenizer = get_tokenizer("byte")
    _, close = tokenizer.document_ids()
    for index, haystack in ((0, "The grass is green."), (1, None)):
        row = ruler_element(cfg, "train", index)
        tokens, mask = row["tokens"], row["loss_mask"]
        assert tokens.shape == mask.shape == (400,)
        answer = tokens[mask > 0]
        assert answer[-1] == close and np.all(tokens[np.flatnonzero(mask)[-1] + 1:] == close)
        text = tokenizer.decode(answer[:-1])
        prompt = tokenizer.decode(tokens[:np.flatnonzero(mask)[0]])
        value = text.strip(" .")
        assert text == answer_text([value]) and value.isdigit() and len(value) == 7
        assert prompt.count(value) == 1 and prompt.endswith("mentioned in the provided text is")
        if haystack:
            assert haystack in prompt  # row 0: niah_single_1, the noise haystack; row 1: niah_single_2, text
        else:
            assert "The grass is green." not in prompt


def test_rows_are_a_function_of_seed_and_index_and_differ_between_them():
    cfg = data_config()
    first = ruler_element(cfg, "train", 4)
    np.testing.assert_array_equal(first["tokens"], ruler_element(cfg, "train", 4)["tokens"])
    assert not np.array_equal(first["tokens"], ruler_element(cfg, "train", 6)["tokens"])
    assert not np.array_equal(first["tokens"], ruler_element(dataclasses.replace(cfg, seed=1), "train", 4)["tokens"])
    assert not np.array_equal(first["tokens"], ruler_element(cfg, "eval", 4)["tokens"])


def test_training_and_held_out_batches_have_the_row_shape_and_loss_on_the_answers():
    cfg = data_config()
    batch = next(iter(ruler_train_dataset(cfg, batch_size=2)))
    assert batch["inputs"].shape == (2, 399)
    assert np.all(batch["loss_mask"].sum(axis=1) == 10)  # " ddddddd." (9 bytes) and the end of document
    config = load_config(None, ["data.source=ruler", "data.seq_len=399", "model.vocab_size=258"])
    held_out = make_eval_batches(config.data, batch_size=2, max_batches=2)
    assert len(held_out) == 2 and all(b["inputs"].shape == (2, 399) for b in held_out)


@pytest.mark.parametrize("changes, message", [
    ({"data__ruler_tasks": "[niah_single_9]"}, "data.ruler_tasks: unknown or no task(s) ['niah_single_9']"),
    ({"data__seq_len": 255}, "data.seq_len=255: niah_single_1 at length 256: the template, needles and answer need"),
])
def test_a_task_that_cannot_make_rows_is_a_config_error_naming_the_key(changes, message):
    with pytest.raises(ConfigError) as error:
        check_ruler(data_config(**changes))
    assert message in str(error.value)
