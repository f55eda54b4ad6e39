"""Fuzzing the config: random values and structures at every depth of the YAML, and damaged YAML bytes.

Each case builds a ``Config`` or raises ``ConfigError`` naming the key or the file; nothing is written.
"""

from pathlib import Path

import pytest
import yaml

from fuzzing import FUZZ_CASES, SLOW_CASES, byte_cases, failures, tree_snapshot, value_cases
from seqmodels.config import Config
from seqmodels.config_io import load_config, to_dict

ROOT = Path(__file__).resolve().parents[2]
BUDGETS = [pytest.param(FUZZ_CASES * 2, 0, id="fast"), pytest.param(SLOW_CASES, 1, id="slow", marks=pytest.mark.slow)]


def _as_yaml(tree) -> bytes:
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True).encode()


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_random_values_and_structures_at_every_depth_load_or_name_the_key(tmp_path, count, seed):
    """The whole default config, one value (or section) replaced by a value of another type, or deleted."""
    path = tmp_path / "config.yaml"
    cases = [(label, _as_yaml(tree)) for label, tree in value_cases(to_dict(Config()), seed, count)]
    found = failures(cases, path.write_bytes, lambda: load_config(path))
    assert not found, "\n".join(found[:5])
    assert tree_snapshot(tmp_path) == {Path("config.yaml")}


@pytest.mark.parametrize("name", ["transformer.yaml", "atlas.yaml", "ahn_deltanet.yaml"])
@pytest.mark.parametrize("count, seed", BUDGETS)
def test_damaged_config_files_load_or_name_the_file(tmp_path, name, count, seed):
    source = ROOT / "configs" / name
    if not source.is_file():
        pytest.fail(f"{source} is gone: name another config file here")
    path = tmp_path / name
    found = failures(byte_cases(source.read_bytes(), seed, count), path.write_bytes, lambda: load_config(path))
    found += failures(
        [(label, _as_yaml(tree)) for label, tree in value_cases(yaml.safe_load(source.read_text()), seed, count)],
        path.write_bytes, lambda: load_config(path))
    assert not found, "\n".join(found[:5])
