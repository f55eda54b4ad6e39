import pytest

from seqmodels.config import ConfigError
from seqmodels.config_io import load_config, parse_mixers, save_config


def test_overrides_set_nested_values_and_mixer_expressions():
    config = load_config(None, ["train.steps=20", "train.batch_size=8", "data.seq_len=128",
                                "model.mixers=[swa, attention] * 2 + [attention]", "optim.learning_rate=1e-3"])
    assert config.train.steps == 20 and config.train.batch_size == 8 and config.data.seq_len == 128
    assert config.model.mixers == ("swa", "attention", "swa", "attention", "attention")
    assert config.optim.learning_rate == pytest.approx(1e-3)


def test_yaml_file_states_only_what_differs(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  d_model: 64\n  mixers: [swa, swa]\n  swa:\n    window: 8\ntrain:\n  steps: 7\n")
    config = load_config(path, ["train.steps=9"])
    assert config.model.d_model == 64 and config.model.mixers == ("swa", "swa")
    assert config.model.swa.window == 8 and config.train.steps == 9
    assert config.model.num_heads == 4  # default kept


@pytest.mark.parametrize("override, message", [
    ("train.stpes=3", r"unknown config key 'train.stpes'; nearest valid keys: train.steps"),
    ("model.swa.windw=3", r"nearest valid keys: model.swa.window"),
    ("train.steps=abc", r"train.steps: expected int, got 'abc'"),
    ("train.steps=2.5", r"train.steps: expected int"),
    ("model.tie_embeddings=3", r"model.tie_embeddings: expected bool"),
    ("model.d_model=130", r"model.d_model: 130 is not divisible by model.num_heads=4"),
    ("data.seq_len=9000", r"data.seq_len: 9000 exceeds model.max_seq_len=4096"),
    ("model.mixers=[swa, attention", r"model.mixers: cannot parse"),
    ("train", r"not of the form key.sub=value"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_key_given_twice_is_an_error_on_the_command_line_and_in_yaml(tmp_path):
    with pytest.raises(ConfigError, match="'train.steps' is given twice"):
        load_config(None, ["train.steps=3", "train.steps=4"])
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  steps: 3\n  steps: 4\n")
    with pytest.raises(ConfigError, match=r"key 'steps' is given twice \(line 3\)"):
        load_config(path)


def test_missing_and_malformed_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)


def test_saved_config_loads_back_to_an_equal_config(tmp_path):
    config = load_config(None, ["model.mixers=[swa] * 3", "optim.name=adamw", "train.steps=11"])
    save_config(config, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == config


def test_parse_mixers_accepts_lists_and_rejects_empty_names():
    assert parse_mixers(["a", "b"]) == ("a", "b")
    with pytest.raises(ConfigError):
        parse_mixers(["a", ""])


def test_every_config_file_in_configs_loads():
    from pathlib import Path
    files = sorted(Path("configs").glob("**/*.yaml"))
    assert files, "configs/ holds no YAML"
    for path in files:
        load_config(path)
