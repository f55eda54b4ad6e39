"""``seqmodels.hf.base``: a model whose architecture and weights come from another checkpoint (``model.init_from``,
``model.ahn.base``), one rule for what the user set; the default AHN base converted once."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from flax.nnx import traversals

from seqmodels.config import Config, ConfigError, ModelConfig
from seqmodels.config_ahn import AHNConfig
from seqmodels.config_io import load_config, save_config
from seqmodels.hf.base import explicit_model_keys, resolve_base, start_params
from seqmodels.models import build_model
from seqmodels.models.ahn import trainable_path
from tests.seqmodels.models.ahn_fixtures import write_tiny_base


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return write_tiny_base(tmp_path_factory.mktemp("base") / "base")


def test_a_run_directory_base_of_another_kind_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    save_config(Config(model=ModelConfig(kind="looped")), tmp_path / "run" / "config.yaml")
    with pytest.raises(ConfigError, match=r"^model\.ahn\.base: the run .* is model\.kind='looped'"):
        resolve_base(Config(model=ModelConfig(kind="ahn", ahn=AHNConfig(base=str(tmp_path / "run")))))


def test_an_architecture_setting_that_contradicts_the_base_is_a_config_error(tiny_base):
    directory, _, _ = tiny_base
    with pytest.raises(ConfigError, match=r"^model\.d_model=256 conflicts with model\.ahn\.base="):
        resolve_base(load_config(None, ["model.kind=ahn", f"model.ahn.base={directory}", "model.d_model=256"]))


def test_the_ahn_base_and_init_from_follow_one_rule_for_what_the_user_set(tiny_base):
    """128 is model.d_model's default: named by an override it is the user's (a conflict with the base's 64),
    without the record of what was named it is the default, which the base's value replaces."""
    directory, _, _ = tiny_base
    for start in (["model.kind=ahn", f"model.ahn.base={directory}"], [f"model.init_from=hf:{directory}"]):
        overrides = [*start, "model.d_model=128", "data.seq_len=32"]
        with pytest.raises(ConfigError, match=r"model\.d_model=128 conflicts with model\.(ahn\.base|init_from)="):
            resolve_base(load_config(None, overrides), explicit_model_keys(None, overrides))
        assert resolve_base(load_config(None, overrides)).model.d_model == 64


def test_max_seq_len_is_the_users_when_set_else_the_bases(tiny_base):
    directory, base_config, _ = tiny_base
    overrides = ["model.kind=ahn", f"model.ahn.base={directory}", "data.seq_len=32"]
    assert resolve_base(load_config(None, overrides)).model.max_seq_len == base_config.max_seq_len == 512
    shorter = [*overrides, "model.max_seq_len=128"]
    assert resolve_base(load_config(None, shorter), explicit_model_keys(None, shorter)).model.max_seq_len == 128


def test_init_from_is_refused_by_a_kind_that_starts_elsewhere(tiny_base):
    directory, _, _ = tiny_base
    with pytest.raises(ConfigError, match=r"model\.init_from=hf:.*model\.kind=looped starts from no checkpoint"):
        resolve_base(Config(model=ModelConfig(kind="looped", init_from=f"hf:{directory}")))
    with pytest.raises(ConfigError, match=r"model\.kind=ahn starts from model\.ahn\.base"):
        resolve_base(Config(model=ModelConfig(kind="ahn", init_from=f"hf:{directory}")))


def test_start_params_put_the_base_in_and_keep_the_fresh_compressors(tiny_base):
    directory, _, base_params = tiny_base
    config = resolve_base(load_config(None, ["model.kind=ahn", f"model.ahn.base={directory}", "data.seq_len=32"]))
    fresh = nnx.to_pure_dict(nnx.state(build_model(config.model, seed=3), nnx.Param))
    started = traversals.flatten_mapping(start_params(config.model, fresh))
    base, fresh = traversals.flatten_mapping(base_params), traversals.flatten_mapping(fresh)
    assert started.keys() == fresh.keys() and any(trainable_path(path) for path in started)
    for path, leaf in started.items():
        expected = fresh[path] if trainable_path(path) else base[path]
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(expected), err_msg=str(path))


def test_start_params_refuse_an_unresolved_model_and_leave_a_fresh_start_as_it_is(tiny_base):
    directory, base_config, base_params = tiny_base
    unresolved = ModelConfig(kind="ahn", ahn=AHNConfig(base=str(directory)))  # d_model 128, the base's is 64
    with pytest.raises(ConfigError, match="does not match model.ahn.base=.*resolve it first"):
        start_params(unresolved, {})
    fresh = nnx.to_pure_dict(nnx.state(build_model(base_config), nnx.Param))
    assert start_params(base_config, fresh) is fresh  # no model.init_from: nothing to read
    lm = resolve_base(Config(model=dataclasses.replace(base_config, init_from=f"hf:{directory}"))).model
    loaded = start_params(lm, fresh)
    assert jax.tree.structure(loaded) == jax.tree.structure(fresh)
    for got, expected in zip(jax.tree.leaves(loaded), jax.tree.leaves(base_params)):  # every weight the base's
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_processes_preparing_the_default_base_together_convert_it_once(tmp_path, monkeypatch):
    """Workers started together on a fresh machine: one converts, the others wait and reuse its directory."""
    import threading
    import time

    from seqmodels.config_ahn import DEFAULT_AHN_BASE
    from seqmodels.hf import base, gguf

    monkeypatch.chdir(tmp_path)
    calls = []

    def slow_convert(source, out_dir):
        calls.append(source)
        time.sleep(0.3)  # long enough for every other worker to arrive while this one converts
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(gguf, "convert_gguf", slow_convert)
    monkeypatch.setattr(gguf, "default_gguf_path", lambda: "smollm2.gguf")
    results, errors = [], []

    def worker():
        try:
            results.append(base.ensure_base(DEFAULT_AHN_BASE))
        except Exception as error:  # noqa: BLE001  (reported by the assertion below)
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert calls == ["smollm2.gguf"]
    assert [str(path) for path in results] == [DEFAULT_AHN_BASE] * 3
