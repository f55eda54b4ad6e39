"""A ``model_type: seqmodels`` export loads and runs alike under every transformers version in ``VERSIONS``.

One causal export (``[swa, gated_deltanet, mamba2]`` with the byte-level tokenizer), one looped
classifier, and a Mamba2 LM in the reference layout (``configs/mamba2.yaml``, exported as transformers' own
``Mamba2ForCausalLM``, no remote code), with the JAX models' logits (and greedy tokens), are made once per test
process; each version runs ``transformers_version_check.py`` in an environment of its own
(``package_environments``: ``pip install transformers==X`` and whatever of its dependencies the version pins
differently, on top of this venv's packages, so torch is this one's and is not downloaded).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from export_parity import BASE_CONFIG, LENGTH, LOGIT_TOLERANCE, NEW_TOKENS, PROMPT, jax_logits, jax_model, \
    looped_config, random_params, tiny_config
from package_environments import package_environment, run_checked

from seqmodels.hf.formats import export_format

pytestmark = pytest.mark.xdist_group("transformers_versions")  # one worker builds the module's exports once

ROOT = Path(__file__).resolve().parents[4]
CHECK = Path(__file__).with_name("transformers_version_check.py")


def pinned_version() -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith("transformers=="):
            return line.split("==")[1].strip()
    raise AssertionError("requirements.txt pins no transformers version")


# the last 4.x release line, the release before the pinned one, and the pinned one (requirements.txt)
VERSIONS = ("4.57.6", "5.23.0", pinned_version())


def transformers_environment(version: str) -> Path:
    """The python of a venv with ``transformers==version`` over this venv's packages (made once, then reused)."""
    return package_environment(f"transformers-{version}", f"transformers=={version}",
                               "__import__('transformers').__version__", version) / "python"


def export_causal(config, directory: Path) -> tuple[Path, Path]:
    """Export a random ``config`` (byte-level tokenizer) to ``directory``; the ``.npz`` beside it holds the JAX
    model's logits and greedy tokens."""
    from seqmodels.hf.export import export_model
    from seqmodels.models.lm import generate
    params = random_params(config)
    directory = export_model(config, params, directory, tokenizer="byte")
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(2, LENGTH))
    model = jax_model(config, params)
    expected = directory.with_suffix(".npz")
    np.savez(expected, tokens=tokens, logits=np.asarray(jax_logits(model, jnp.asarray(tokens))),
             greedy=np.asarray(generate(model, tokens[:, :PROMPT], NEW_TOKENS)[0]), prompt=PROMPT,
             new_tokens=NEW_TOKENS, pad_id=257)
    return directory, expected


def check_under(version: str, *arguments) -> dict:
    """The ``result`` of ``transformers_version_check.py arguments...`` under transformers ``version``."""
    python = transformers_environment(version)
    output = run_checked([str(python), str(CHECK), *map(str, arguments)], f"the check under transformers {version}")
    lines = [line for line in output.splitlines() if line.startswith("result: ")]
    assert len(lines) == 1, output
    return json.loads(lines[0][len("result: "):])


def assert_causal_result(result: dict, version: str, architecture: str) -> None:
    assert result["transformers"] == version and result["architecture"] == architecture, result
    assert result["max_abs"] < LOGIT_TOLERANCE and result["cached_max_abs"] < LOGIT_TOLERANCE, result
    assert result["greedy_equal"] and result["padded_generation_equal"], result
    assert result["tokenizer"] == {"ids_equal": True, "decoded_equal": True, "bos_id": 256, "eos_id": 257,
                                   "class": result["tokenizer"]["class"]}, result


@pytest.fixture(scope="module")
def export_and_expected(tmp_path_factory):
    """The export's directory and an ``.npz`` of the JAX model's logits and greedy tokens for it."""
    from seqmodels.hf.export import export_model
    config = dataclasses.replace(tiny_config(BASE_CONFIG), vocab_size=258, mixers=("swa", "gated_deltanet", "mamba2"))
    directory, expected = export_causal(config, tmp_path_factory.mktemp("export") / "hf")
    config = looped_config("looped_cfl")
    params = random_params(config, noise=0.2)
    looped = export_model(config, params, directory.parent / "looped")
    rows = np.concatenate([np.full((4, 1), 5), np.random.default_rng(1).integers(6, 26, size=(4, 6)),
                           np.full((4, 1), 2)], axis=1)  # [BOS] w [CLS]
    looped_expected = directory.parent / "looped.npz"
    np.savez(looped_expected, tokens=rows, logits=np.asarray(jax_logits(jax_model(config, params), jnp.asarray(rows))))
    return directory, expected, looped, looped_expected


@pytest.fixture(scope="module")
def mamba2_export_and_expected(tmp_path_factory):
    """A ``Mamba2ForCausalLM`` export of two reference-layout Mamba2 layers and its ``.npz`` (``export_causal``)."""
    config = dataclasses.replace(tiny_config(ROOT / "configs" / "mamba2.yaml"), vocab_size=258)
    assert export_format(config) == "mamba2", export_format(config)
    return export_causal(config, tmp_path_factory.mktemp("mamba2") / "hf")


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_the_export_gives_jax_logits_greedy_tokens_and_byte_ids_under_transformers(version, export_and_expected):
    result = check_under(version, *export_and_expected)
    print(f"| {version} | {result['torch']} | {result['max_abs']:.2e} | {result['cached_max_abs']:.2e} | "
          f"{result['greedy_equal']} | {result['padded_generation_equal']} | {result['tokenizer']['ids_equal']} | "
          f"{result['looped']['max_abs']:.2e} |")
    assert_causal_result(result, version, "SeqmodelsForCausalLM")
    assert result["looped"]["architecture"] == "SeqmodelsLoopedForSequenceClassification"
    assert result["looped"]["max_abs"] < LOGIT_TOLERANCE, result["looped"]


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_a_mamba2_export_gives_jax_logits_greedy_tokens_and_byte_ids_under_transformers(
        version, mamba2_export_and_expected):
    """transformers' own ``Mamba2ForCausalLM`` (its pure-PyTorch path): the whole-row and cached logits, greedy and
    left-padded generation, and the byte-level tokenizer, as for the remote-code export."""
    result = check_under(version, *mamba2_export_and_expected)
    print(f"| {version} | Mamba2ForCausalLM | {result['max_abs']:.2e} | {result['cached_max_abs']:.2e} | "
          f"{result['greedy_equal']} | {result['padded_generation_equal']} | {result['tokenizer']['ids_equal']} |")
    assert_causal_result(result, version, "Mamba2ForCausalLM")
