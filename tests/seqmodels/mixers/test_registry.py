"""The mixer registry: every registered mixer builds from a config and offers the Mixer interface."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.mixers import MIXERS, Mixer, build_mixer, check_mixer_names, mixer_flops_per_token


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_registered_mixer_offers_the_mixer_interface(name):
    config = ModelConfig(d_model=32, num_heads=2, max_seq_len=32, kernel_impl="xla")
    mixer = build_mixer(name, config, nnx.Rngs(params=0))
    assert isinstance(mixer, Mixer)
    x = jax.random.normal(jax.random.key(0), (2, 8, 32))
    y, cache = jax.eval_shape(lambda: mixer(x, segment_ids=jnp.ones((2, 8), jnp.int32)))
    assert y.shape == x.shape and cache is None
    assert mixer_flops_per_token(name, config, 8) > 0


def test_an_object_without_init_cache_is_not_a_mixer():
    class Half:
        def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
            return x, cache

    assert not isinstance(Half(), Mixer)


def test_unknown_mixers_are_named_with_the_key_and_the_known_ones():
    with pytest.raises(ConfigError, match="model.mixers: unknown mixer 'rnn'; known mixers: .*attention"):
        check_mixer_names(["attention", "rnn"])
    with pytest.raises(ConfigError, match="model.looped.mixer: unknown mixer 'rnn'"):
        check_mixer_names(["rnn"], key="model.looped.mixer")


def test_every_mixer_reads_registered_sections_that_are_fields_of_the_model_config():
    from seqmodels.mixers.registry import SECTIONS, registered_sections

    assert registered_sections() == dict(sorted(SECTIONS.items()))
    for name, entry in MIXERS.items():
        assert entry.sections and all(hasattr(ModelConfig(), section) for section in entry.sections), name
    assert MIXERS["gated_deltanet"].sections == ("deltanet",)
    assert set(MIXERS["atlas_mag"].sections) == {"atlas", "attention", "swa"}
    assert set(MIXERS["muonssm_mamba2"].sections) == {"mamba2", "muonssm"}


def test_a_section_registered_twice_is_an_error(monkeypatch):
    from seqmodels.mixers import registry
    from seqmodels.mixers.attention import SlidingWindowConfig

    monkeypatch.setattr(registry, "SECTIONS", dict(registry.SECTIONS))
    with pytest.raises(ValueError, match="config section model.swa is registered twice"):
        registry.register_section("swa", SlidingWindowConfig, "again")
    with pytest.raises(TypeError, match="model.plain: .* must be a frozen dataclass"):
        registry.register_section("plain", dict, "not a dataclass")


def test_a_mixer_naming_an_unknown_section_is_an_error(monkeypatch):
    from seqmodels.mixers import registry

    monkeypatch.setattr(registry, "MIXERS", dict(registry.MIXERS))
    registry.register("rnn", MIXERS["attention"].build, MIXERS["attention"].flops_per_token, sections=("rnn",))
    with pytest.raises(ValueError, match="mixer 'rnn' reads config section model.rnn, which no module registers"):
        registry.registered_sections()
    with pytest.raises(ValueError, match="mixer 'gru': sections must name at least one config section"):
        registry.register("gru", MIXERS["attention"].build, MIXERS["attention"].flops_per_token, sections=())


def test_importing_the_package_imports_every_mixer_module():
    import sys
    from pathlib import Path

    import seqmodels.mixers

    names = {path.stem for path in Path(seqmodels.mixers.__file__).parent.glob("*.py")} - {"__init__"}
    assert names >= {"atlas", "attention", "registry"}
    assert all(f"seqmodels.mixers.{name}" in sys.modules for name in names)


def test_mixers_and_layers_never_import_the_assembled_config():
    """``seqmodels.config`` imports every mixer to assemble ``ModelConfig``: an import back is a cycle."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "seqmodels"
    for path in sorted([*root.glob("mixers/*.py"), *root.glob("layers/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                       [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                       if isinstance(node, ast.ImportFrom) and node.module else [])
            assert "seqmodels.config" not in modules, f"{path.name} imports seqmodels.config"


@pytest.mark.parametrize("mixer, setting, key", [
    ("atlas", dict(atlas=dict(poly_key_dim=64)), "model.atlas.poly_key_dim"),
    ("mamba2", dict(mamba2=dict(head_dim=48)), "model.mamba2.head_dim"),
    ("swa", dict(attention=dict(num_kv_heads=3)), "model.attention.num_kv_heads"),
    ("attention", dict(attention=dict(causal=False)), "model.attention.causal"),
])
def test_a_section_is_checked_against_the_model_only_when_a_layer_reads_it(mixer, setting, key):
    import dataclasses

    def model(mixers):
        defaults = ModelConfig()
        sections = {name: dataclasses.replace(getattr(defaults, name), **values) for name, values in setting.items()}
        return ModelConfig(mixers=mixers, **sections)

    with pytest.raises(ConfigError, match=f"^{key}: "):
        model((mixer, "gated_deltanet"))
    assert model(("gated_deltanet",)).mixers == ("gated_deltanet",)
