"""The RULER suite: RULER's string-match scoring, and the suite on untrained models of several mixers."""

import sys
from pathlib import Path

import numpy as np
import pytest

from seqmodels.config_base import ConfigError
from seqmodels.config_io import load_config
from seqmodels.data.ruler_tasks import TASKS, answer_text, essay_sentences, ruler_examples
from seqmodels.data.tokenizers import ByteTokenizer, get_tokenizer
from seqmodels.evaluation.ruler import (evaluate_ruler, markdown_table, plot_heatmap, postprocess, string_match_all,
                                        string_match_part)
from seqmodels.models.kinds import build_model

sys.path.insert(0, str(Path(__file__).parents[1] / "hf"))
from hf_models import save_byte_level_tokenizer  # noqa: E402

SENTENCES = essay_sentences(["The mill stood by the river. Rain fell all week! Who closed the bridge? " * 40])


@pytest.mark.parametrize("task", TASKS)
def test_the_scorer_gives_the_reference_answer_one_and_a_wrong_answer_zero(task):
    examples = ruler_examples(task, ByteTokenizer(), length=2048, depths=[0.5], per_depth=3, seed=1,
                              sentences=SENTENCES)
    others = ruler_examples(task, ByteTokenizer(), length=2048, depths=[0.5], per_depth=3, seed=2,
                            sentences=SENTENCES)
    for example, other in zip(examples, others):
        assert string_match_all(postprocess(answer_text(example.references)), example.references) == 1.0
        assert string_match_all(postprocess(answer_text(other.references)), example.references) == 0.0


def test_string_match_all_counts_each_reference_and_part_takes_any_one_ignoring_case():
    references = ["7351234", "ABCDE-fgh", "9999999", "1111111"]
    assert string_match_all("7351234 and abcde-FGH", references) == 0.5
    assert string_match_part("7351234 and abcde-FGH", references) == 1.0
    assert string_match_part("nothing", references) == 0.0
    assert postprocess("  12\x0345\t ") == "12\n45"
    with pytest.raises(ValueError, match="references must not be empty"):
        string_match_all("x", [])


def test_an_hf_tokenizer_gives_prompts_of_the_exact_length_that_decode_to_the_task(tmp_path):
    tokenizer = get_tokenizer(f"hf:{save_byte_level_tokenizer(tmp_path / 'tok')}")
    for task in ("niah_single_1", "niah_multivalue", "fwe"):
        for example in ruler_examples(task, tokenizer, length=2048, depths=[0.0, 1.0], per_depth=1, seed=3,
                                      sentences=SENTENCES):
            assert example.prompt.size + example.max_new_tokens == 2048
            text = tokenizer.decode(example.prompt)
            assert all(text.count(r) >= 1 for r in example.references)


@pytest.fixture
def stdlib_config():
    return load_config(None, ["model.d_model=32", "model.num_heads=2", "model.max_seq_len=640",
                              "model.mixers=[mamba2, attention]", "data.seq_len=64"])


def test_the_suite_runs_on_a_recurrent_hybrid_and_reports_every_cell(stdlib_config, tmp_path):
    model = build_model(stdlib_config.model)
    result = evaluate_ruler(model, stdlib_config, tasks=["niah_single_2", "vt"], lengths=[640, 4096],
                            depths=[0.0, 1.0], per_depth=1, seed=0, batch_size=2)
    cell = result["tasks"]["niah_single_2"]["by_length"]["640"]
    assert 0.0 <= cell["score"] <= 1.0 and cell["examples"] == 2 and set(cell["by_depth"]) == {"0.0", "1.0"}
    assert cell["interval"]["low"] <= cell["score"] <= cell["interval"]["high"]
    assert "need" in result["tasks"]["vt"]["by_length"]["640"]["skipped"]  # vt's template does not fit 640
    assert result["lengths"] == [640] and "max_seq_len=640" in result["skipped_lengths"]["4096"]
    table = markdown_table(result)
    assert "| niah_single_2 |" in table and "skipped (too short)" in table and "length 4096 left out" in table
    plot_heatmap(result, "niah_single_2", tmp_path / "heat.png")
    assert (tmp_path / "heat.png").stat().st_size > 1000
    with pytest.raises(ConfigError, match="every length exceeds model.max_seq_len=640"):
        evaluate_ruler(model, stdlib_config, tasks=["niah_single_1"], lengths=[1024], per_depth=1)
    small = load_config(None, ["model.d_model=32", "model.num_heads=2", "model.vocab_size=100", "data.source=mqar"])
    with pytest.raises(ConfigError, match="has 258 ids, more than model.vocab_size=100"):
        evaluate_ruler(build_model(small.model), small, tasks=["niah_single_1"], lengths=[640], per_depth=1)
    with pytest.raises(ConfigError, match="unknown or no task"):
        evaluate_ruler(model, stdlib_config, tasks=["niah"], lengths=[640], per_depth=1)
    assert np.isfinite(cell["max_new_tokens"])


def test_the_suite_decodes_an_ahn_model_with_its_bounded_cache(tmp_path, stdlib_config):
    from tests.seqmodels.models.ahn_fixtures import ahn_model, write_tiny_base
    base_dir, base_config, _ = write_tiny_base(tmp_path / "base", vocab_size=258)
    model, _ = ahn_model(base_dir, base_config, window=32, sinks=4, random_readout=0.02)
    result = evaluate_ruler(model, stdlib_config, tasks=["niah_single_1"], lengths=[512], depths=[0.0, 1.0],
                            per_depth=1, seed=0, batch_size=2)
    cell = result["tasks"]["niah_single_1"]["by_length"]["512"]
    assert cell["examples"] == 2 and 0.0 <= cell["score"] <= 1.0
    assert all(len(sample["prediction"]) <= cell["max_new_tokens"] for sample in cell["samples"])
