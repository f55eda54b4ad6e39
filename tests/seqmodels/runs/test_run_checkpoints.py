"""Which saved model configs the architecture check accepts: keys added later take their defaults."""

import pytest

from seqmodels.config import Config
from seqmodels.config_io import to_dict
from seqmodels.runs.checkpoints import architecture_differences, saved_model_config


def test_keys_added_after_a_checkpoint_take_their_defaults():
    current = to_dict(Config())
    saved = to_dict(Config())
    del saved["model"]["atlas"]["eta_scales"]  # a key added after the save
    del saved["model"]["looped"]               # a whole section added after the save
    assert architecture_differences(saved["model"], current["model"])  # compared raw, they differ
    assert architecture_differences(saved_model_config(saved), current["model"]) == []


def test_a_real_difference_is_still_reported():
    saved = to_dict(Config())
    saved["model"]["atlas"]["window"] = 3
    diffs = architecture_differences(saved_model_config(saved), to_dict(Config())["model"])
    assert diffs == ["model.atlas.window: checkpoint has 3, config has 8"]


def test_a_saved_config_with_an_unknown_key_is_a_config_error():
    saved = to_dict(Config())
    saved["model"]["atlas"]["windw"] = 3
    with pytest.raises(ValueError, match="windw"):
        saved_model_config(saved)
