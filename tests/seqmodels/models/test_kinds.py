"""``seqmodels.models.kinds``: every ``model.kind`` declared once, and each declaration agreeing with what uses it."""

import typing

import jax
import numpy as np
import pytest
from flax import nnx
from flax.nnx import traversals

import eval as eval_entry
from seqmodels.config import ConfigError, ModelConfig
from seqmodels.models import KINDS, abstract_model, build_model, kinds_measured_by, model_kind, trainable_filter
from seqmodels.models.ahn import AHNModel, trainable_path
from seqmodels.models.lm import LM
from seqmodels.models.looped import LoopedModel


def test_every_kind_the_config_accepts_is_declared():
    kinds = typing.get_args(typing.get_type_hints(ModelConfig)["kind"])
    assert set(kinds) == set(KINDS)


@pytest.mark.parametrize("kind,model_class", [("lm", LM), ("looped", LoopedModel), ("ahn", AHNModel)])
def test_build_and_the_abstract_model_dispatch_on_the_kind(kind, model_class):
    config = ModelConfig(kind=kind, d_model=32, num_heads=2, mixers=("attention",) * 2)
    assert isinstance(build_model(config), model_class)
    _, state = abstract_model(config)
    assert jax.tree.structure(nnx.to_pure_dict(state)) == jax.tree.structure(
        nnx.to_pure_dict(nnx.state(build_model(config), nnx.Param)))
    assert (trainable_filter(config) is None) == (kind != "ahn")


def test_an_unknown_kind_is_a_config_error_naming_the_known_ones():
    config = type("Section", (), {"kind": "recurrent"})()
    with pytest.raises(ConfigError, match="model.kind: unknown kind 'recurrent'; known kinds: lm, looped, ahn"):
        model_kind(config)


def test_each_kind_exports_as_a_class_of_the_pytorch_twins():
    from seqmodels.hf.torch import modeling_seqmodels
    for kind in KINDS.values():
        assert hasattr(modeling_seqmodels, kind.export.architecture), kind.name
        assert kind.export.auto_class.startswith("AutoModelFor")


def test_the_suites_the_kinds_name_are_the_suites_eval_py_runs():
    assert {suite for kind in KINDS.values() for suite in kind.suites} == set(eval_entry.SUITES)
    assert [kind.name for kind in kinds_measured_by("perplexity")] == ["lm"]


def test_only_the_kinds_with_a_base_name_one_and_their_merge_keeps_what_they_say():
    assert {name for name, kind in KINDS.items() if kind.base} == {"lm", "ahn"}
    assert KINDS["lm"].base.directory("hf:some/dir") == "some/dir"
    config = ModelConfig(kind="ahn", d_model=32, num_heads=2, mixers=("attention",) * 2)
    fresh = nnx.to_pure_dict(nnx.state(build_model(config, seed=0), nnx.Param))
    base = jax.tree.map(lambda leaf: leaf + 1.0, {**fresh, "blocks": {
        i: {name: part for name, part in block.items() if name != "ahn"} for i, block in fresh["blocks"].items()}})
    merged = traversals.flatten_mapping(KINDS["ahn"].base.merge(fresh, base))
    flat_fresh, flat_base = traversals.flatten_mapping(fresh), traversals.flatten_mapping(base)
    assert merged.keys() == flat_fresh.keys()
    for path, leaf in merged.items():
        np.testing.assert_array_equal(leaf, flat_fresh[path] if trainable_path(path) else flat_base[path])
    assert KINDS["lm"].base.merge(fresh, base) is base
