import dataclasses
import typing
from pathlib import Path

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


@pytest.mark.parametrize("override, message", [
    (f"model.d_model={10**20}", r"model.d_model: 100000000000000000000 does not fit in a 64-bit integer"),
    (f"model.swa.window={-10**20}", r"model.swa.window: -100000000000000000000 does not fit in a 64-bit integer"),
    (f"model.d_model={2**40}", r"model.d_model: must be <= 131,072, got 1,099,511,627,776"),
    (f"model.vocab_size={2**30}", r"model.vocab_size: must be <= 16,777,216"),
    (f"model.max_seq_len={2**40}", r"model.max_seq_len: must be <= 134,217,728"),
    (f"model.d_ff={2**30}", r"model.d_ff: must be <= 1,048,576"),
    (f"data.seq_len={2**40}", r"data.seq_len: must be <= 134,217,728"),
    (f"data.needle_key_length={10**12}", r"data.needle_key_length: must be <= 64"),
    (f"train.steps={2**31}", r"train.steps: must be <= 2,147,483,647"),
    (f"train.batch_size={2**30}", r"train.batch_size: must be <= 16,777,216"),
    (f"train.seed={2**32}", r"train.seed: must be <= 4,294,967,295"),
])
def test_huge_integers_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_largest_allowed_sizes_are_accepted():
    config = load_config(None, ["model.d_model=131072", "model.num_heads=1024", "train.steps=2147483647",
                                "train.seed=4294967295", "model.max_seq_len=134217728"])
    assert config.model.d_model == 2**17 and config.train.steps == 2**31 - 1


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
    # configs/sweeps/ holds sweep files of ablate.py, not run configs (tests/test_ablate.py checks them)
    files = sorted(p for p in Path("configs").glob("**/*.yaml") if p.parts[1] != "sweeps")
    assert files, "configs/ holds no YAML"
    from seqmodels.hf.base import prepare_base
    for path in files:
        prepare_base(path)  # an AHN config's tokenizer is its base's: converted on first use, as train.py does
        load_config(path)


def _literal_fields():
    """``(dotted key, choices)`` of every ``Literal[...]`` field of the schema."""
    import dataclasses
    import typing

    from seqmodels.config import Config

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name], f"{prefix}{f.name}.")
            elif typing.get_origin(hints[f.name]) is typing.Literal:
                yield f"{prefix}{f.name}", typing.get_args(hints[f.name])
    return list(walk(Config, ""))


def test_fields_of_fixed_choices_are_typed_literal():
    keys = {key for key, _ in _literal_fields()}
    assert keys >= {"model.compute_dtype", "model.kernel_impl", "model.remat", "model.kind",
                    "model.attention.implementation", "model.atlas.eta_scales", "model.atlas.ns_coefficients",
                    "model.muonssm.ns_coefficients", "model.looped.loop_schedule", "model.looped.attention",
                    "model.looped.positions", "optim.name", "optim.schedule", "log.progress"}
    # registries decide these (data.tokenizer: byte or hf:DIR, checked by DataConfig and get_tokenizer)
    assert not keys & {"model.mixers", "data.source", "model.looped.mixer", "data.tokenizer"}


@pytest.mark.parametrize("key, choices", _literal_fields())
def test_a_literal_field_refuses_another_value_listing_the_allowed_ones(key, choices, tmp_path):
    listed = f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
    message = f"{key}: must be {listed}, got 'sideways'"
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"{key}=sideways"])
    assert str(error.value) == message
    section, _, name = key.rpartition(".")
    path = tmp_path / "x.yaml"
    path.write_text("".join(f"{'  ' * depth}{part}:\n" for depth, part in enumerate(section.split(".")))
                    + f"{'  ' * (section.count('.') + 1)}{name}: sideways\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == message


@pytest.mark.parametrize("key, choices", _literal_fields())
def test_a_literal_field_accepts_each_of_its_values(key, choices):
    for choice in choices:
        section, _, name = key.rpartition(".")
        loaded = load_config(None, [f"{key}={choice}"])
        for part in section.split("."):
            loaded = getattr(loaded, part)
        assert getattr(loaded, name) == choice


def test_a_literal_field_is_checked_when_a_section_is_built_directly_too():
    from seqmodels.config import LogConfig, ModelConfig
    from seqmodels.mixers.attention import AttentionConfig

    with pytest.raises(ConfigError, match=r"^log.progress: must be auto, always or never, got 'sometimes'$"):
        LogConfig(progress="sometimes")
    with pytest.raises(ConfigError, match=r"^model.attention.implementation: must be auto, xla, cudnn, splash, flash or banded, got 'flash2'$"):
        AttentionConfig(implementation="flash2")
    with pytest.raises(ConfigError, match=r"^model.compute_dtype: must be float32 or bfloat16, got 1$"):
        ModelConfig(compute_dtype=1)


def test_a_literal_value_must_be_the_string_itself_not_a_yaml_bool_or_number():
    with pytest.raises(ConfigError, match=r"^log.progress: must be auto, always or never, got True$"):
        load_config(None, ["log.progress=yes"])  # YAML 1.1 reads `yes` as true


def test_help_config_lists_the_choices_of_literal_fields():
    from seqmodels.config_io import help_text

    lines = {line.split(" = ")[0]: line for line in help_text().splitlines()}
    assert lines["model.remat"].endswith("(one of: none | full | dots | names)")
    assert lines["optim.schedule"].endswith("(one of: cosine | linear | constant)")
    assert "one of" not in lines["model.d_model"]


def test_mixer_sections_live_beside_their_mixers():
    import seqmodels.config as config
    from seqmodels.config_looped import LoopedConfig
    from seqmodels.mixers.atlas import AtlasConfig
    from seqmodels.mixers.attention import AttentionConfig, SlidingWindowConfig

    hints = typing.get_type_hints(config.ModelConfig)
    for key, section, module in (("attention", AttentionConfig, "seqmodels.mixers.attention"),
                                 ("swa", SlidingWindowConfig, "seqmodels.mixers.attention"),
                                 ("atlas", AtlasConfig, "seqmodels.mixers.atlas"),
                                 ("looped", LoopedConfig, "seqmodels.config_looped")):
        assert hints[key] is section and section.__module__ == module
    defaults = load_config(None)
    assert defaults.model.attention.causal is True and defaults.model.looped.mixer == "attention"


def test_model_config_has_the_base_keys_then_one_field_per_registered_section():
    from seqmodels.config import ModelConfig
    from seqmodels.config_model import ModelConfigBase
    from seqmodels.mixers.registry import SECTIONS

    base = [f.name for f in dataclasses.fields(ModelConfigBase)]
    assert [f.name for f in dataclasses.fields(ModelConfig)] == base + sorted(SECTIONS)
    assert set(SECTIONS) >= {"attention", "swa", "atlas", "mamba2", "longhorn", "deltanet", "muonssm"}
    hints = typing.get_type_hints(ModelConfig)
    for name, entry in SECTIONS.items():
        assert hints[name] is entry.section and getattr(ModelConfig(), name) == entry.section()
    with pytest.raises(TypeError, match="build seqmodels.config.ModelConfig"):
        ModelConfigBase()


def test_a_section_named_like_a_model_key_is_refused():
    from seqmodels.config import model_config_class
    from seqmodels.mixers.registry import SECTIONS, SectionEntry

    with pytest.raises(ValueError, match="model.looped would replace the model key model.looped"):
        model_config_class({**SECTIONS, "looped": SectionEntry(SECTIONS["swa"].section, "a clash")})


def test_every_registered_section_is_listed_by_help_config_with_each_field():
    from seqmodels.config_io import help_text
    from seqmodels.mixers.registry import MIXERS, SECTIONS

    lines = {line.split(" = ")[0]: line for line in help_text().splitlines()}
    for mixer, entry in MIXERS.items():
        for section in entry.sections:
            for field in dataclasses.fields(SECTIONS[section].section):
                line = lines[f"model.{section}.{field.name}"]
                assert f"# {field.metadata['help']}" in line, (mixer, line)


def _run_config_files():
    # configs/sweeps/ holds sweep files of ablate.py, not run configs (tests/test_ablate.py checks them)
    return sorted(p for p in Path("configs").glob("**/*.yaml") if p.parts[1] != "sweeps")


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


@pytest.mark.parametrize("path", _run_config_files(), ids=str)
def test_every_config_file_round_trips_and_each_of_its_keys_holds_the_value_it_names(path, tmp_path):
    from seqmodels.config_io import config_from_dict, read_yaml, to_dict
    from seqmodels.hf.base import prepare_base

    prepare_base(path)  # an AHN config's tokenizer is its base's (as test_every_config_file_in_configs_loads)
    config = load_config(path)
    assert config_from_dict(to_dict(config)) == config
    save_config(config, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == config and read_yaml(tmp_path / "saved.yaml") == to_dict(config)
    resolved = dict(_leaves(to_dict(config)))
    for key, value in _leaves(read_yaml(path)):
        named = list(parse_mixers(value)) if key == "model.mixers" else value
        named = float(named) if isinstance(named, str) and isinstance(resolved[key], float) else named
        assert resolved[key] == named and type(resolved[key]) in (type(named), float), (key, resolved[key], value)
