"""Every config value is checked when the config is built: finite floats, and the model's shape constraints."""

import dataclasses
import typing

import pytest

from seqmodels.config import Config, ConfigError
from seqmodels.config_io import all_keys, config_from_dict, load_config


def _float_keys(cls=Config, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _float_keys(hints[f.name], f"{prefix}{f.name}.")
        elif hints[f.name] is float:
            keys.append(prefix + f.name)
    return keys


def _tree(key: str, value) -> dict:
    tree = node = {}
    *sections, leaf = key.split(".")
    for section in sections:
        node[section] = {}
        node = node[section]
    node[leaf] = value
    return tree


FLOAT_KEYS = _float_keys()


def test_the_float_settings_are_found():
    assert "optim.learning_rate" in FLOAT_KEYS and "model.attention.rope_theta" in FLOAT_KEYS
    assert set(FLOAT_KEYS) <= set(all_keys()) and len(FLOAT_KEYS) > 20


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 10 ** 400], ids=["inf", "-inf", "nan", "1e400"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_a_non_finite_float_setting_is_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"^{key}: must be a finite number"):
        config_from_dict(_tree(key, value))


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e400"])
def test_infinities_written_in_yaml_or_an_override_are_refused(tmp_path, text):
    path = tmp_path / "x.yaml"
    path.write_text(f"optim:\n  eps: {text}\n")
    with pytest.raises(ConfigError, match="optim.eps: must be a finite number"):
        load_config(path)
    with pytest.raises(ConfigError, match="train.guard_sigma: must be a finite number"):
        load_config(None, [f"train.guard_sigma={text}"])


@pytest.mark.parametrize("mixer", ["attention", "swa"])
@pytest.mark.parametrize("d_model, num_heads", [(6, 2), (8, 8), (20, 4)])
def test_an_odd_attention_head_width_is_refused_naming_the_keys(mixer, d_model, num_heads):
    with pytest.raises(ConfigError, match=r"model.d_model: .* must be even \(RoPE rotates pairs\).*model.num_heads"):
        load_config(None, [f"model.mixers=[{mixer}]", f"model.d_model={d_model}", f"model.num_heads={num_heads}"])
    fixed = load_config(None, [f"model.mixers=[{mixer}]", f"model.d_model={d_model}", f"model.num_heads={num_heads}",
                               "model.attention.head_dim=4"])
    assert fixed.model.attention_head_dim == 4


@pytest.mark.parametrize("override, message", [
    ("optim.eps=-1e-8", "optim.eps: must be > 0"), ("optim.eps=0", "optim.eps: must be > 0"),
    ("train.seed=-1", "train.seed: must be >= 0"), ("data.seed=-3", "data.seed: must be >= 0"),
])
def test_values_outside_their_range_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
