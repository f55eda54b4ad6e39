"""RULER's synthetic tasks: deterministic prompts of an exact length, answers placed as each task defines."""

import re

import numpy as np
import pytest

from seqmodels.data.ruler_tasks import (DEPTH_TASKS, NIAH, NOISE, TASKS, answer_text, essay_sentences,
                                        ruler_examples)
from seqmodels.data.tokenizers import ByteTokenizer

TOKENIZER = ByteTokenizer()
# Held-out-like prose with sentences; numbers in it are 4 digits, so never a 7-digit needle value.
SENTENCES = essay_sentences([f"Document {i} describes the river near the old mill. It rained for {1000 + i} days! "
                             "Was the bridge closed? The ferry kept running, and the town kept busy. " * 20
                             for i in range(6)])
LENGTH = 2048


def examples(task, seed=5, length=LENGTH, depths=(0.0, 0.5, 1.0), per_depth=2):
    return ruler_examples(task, TOKENIZER, length=length, depths=depths, per_depth=per_depth, seed=seed,
                          sentences=SENTENCES)


@pytest.mark.parametrize("task", TASKS)
def test_each_task_is_deterministic_per_seed_and_fills_its_length_exactly(task):
    first, again, other = examples(task), examples(task), examples(task, seed=6)
    assert [e.prompt.tolist() for e in first] == [e.prompt.tolist() for e in again]
    assert [e.references for e in first] == [e.references for e in again]
    assert [e.references for e in first] != [e.references for e in other]
    assert len(first) == 6
    for example in first:
        assert example.prompt.size + example.max_new_tokens == LENGTH
        assert example.prompt[0] == TOKENIZER.bos_id
        assert example.max_new_tokens >= TOKENIZER.encode(answer_text(example.references)).size
        assert (example.depth is None) == (task not in DEPTH_TASKS)


@pytest.mark.parametrize("task", list(NIAH))
def test_every_needle_value_occurs_once_and_the_first_asked_sits_at_its_depth(task):
    for example in examples(task):
        text = TOKENIZER.decode(example.prompt)
        for value in example.references:
            assert text.count(value) == 1, (task, value)
        spec = NIAH[task]
        expected = spec.queries * spec.values
        assert len(example.references) == expected
        assert text.count("One of the special magic") >= spec.keys * spec.values
        context_start = text.index("afterwards.\n") + len("afterwards.\n")
        context_end = text.rindex("\nWhat ")
        position = (text.index(example.references[0]) - context_start) / (context_end - context_start)
        assert abs(position - example.depth) < 0.2, (task, example.depth, position)
        if spec.haystack == "noise":
            assert NOISE in text
        if expected == 1:  # RULER's singular wording
            assert text.startswith("A special magic") and text.endswith("mentioned in the provided text is")
        else:
            assert text.startswith("Some special magic") and text.endswith("mentioned in the provided text are")


def test_variable_tracking_chains_five_variables_to_a_value_stated_once_in_the_context():
    for example in examples("vt"):
        text = TOKENIZER.decode(example.prompt)
        value = re.search(r"assigned the value (\d{5}), they are: $", text).group(1)
        context = text[text.rindex("in the following text.\n\n"):text.rindex("\nQuestion:")]
        assert context.count(value) == 1
        names = example.references
        assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
        assert f"VAR {names[0]} = {value}" in context
        positions = [context.index(f"VAR {b} = VAR {a} ") for a, b in zip(names, names[1:])]
        assert positions == sorted(positions) and context.index(f"VAR {names[0]} =") < positions[0]


def test_common_words_occur_more_often_than_every_other_word():
    for example in examples("cwe"):
        text = TOKENIZER.decode(example.prompt)
        listed = text[text.rindex("Memorize the ones that appear most often.\n"):text.rindex("\nQuestion:")]
        words = re.findall(r"\d+\. (\w+)", listed)
        counts = {w: words.count(w) for w in set(words)}
        assert len(example.references) == 10
        assert min(counts[w] for w in example.references) == 6  # 6 / 1 below 4096 tokens, as RULER
        assert max(c for w, c in counts.items() if w not in example.references) == 1


def test_frequent_words_are_ranks_two_to_four_of_the_coded_text():
    for example in examples("fwe"):
        text = TOKENIZER.decode(example.prompt)
        coded = text[text.index("coded words. ") + len("coded words. "):text.rindex("\nQuestion:")].split()
        counts = sorted(((coded.count(w), w) for w in set(coded) if w != "..."), reverse=True)
        assert coded.count("...") > counts[0][0]
        assert {w for _, w in counts[:3]} == set(example.references)
        assert counts[2][0] > (counts[3][0] if len(counts) > 3 else 0)


def test_a_length_too_short_for_a_task_says_how_many_tokens_it_needs():
    with pytest.raises(ValueError, match=r"vt at length 1024: the template, needles and answer need \d+ tokens"):
        examples("vt", length=1024)
    with pytest.raises(ValueError, match=r"cwe at length 600: the template and the smallest list need \d+"):
        examples("cwe", length=600)
    with pytest.raises(ValueError, match="unknown RULER task 'niah'"):
        examples("niah")
    with pytest.raises(ValueError, match="depths must be fractions"):
        examples("niah_single_1", depths=(1.5,))


def test_the_essay_haystack_needs_text():
    with pytest.raises(ValueError, match="essay haystack needs held-out text"):
        ruler_examples("niah_single_2", TOKENIZER, length=LENGTH, depths=[0.5], per_depth=1, seed=0)


def test_essay_sentences_split_after_punctuation_and_cap_long_runs():
    sentences = essay_sentences(["One two.  Three\nfour? " + " ".join(["w"] * 120)])
    assert sentences[:2] == ["One two.", "Three four?"]
    assert [len(s.split()) for s in sentences[2:]] == [50, 50, 20]
    assert np.all([s for s in sentences])
