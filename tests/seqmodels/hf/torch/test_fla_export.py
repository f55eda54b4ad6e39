"""``export.py --format fla``: a DeltaNet / Gated DeltaNet LM as flash-linear-attention's own model.

The export of a tiny random LM (every layer ``gated_deltanet``, tied, the byte-level tokenizer; every layer
``deltanet``, untied), its q/k/v convolution biases zero, is loaded by fla 0.6.0's ``AutoModelForCausalLM``
(``fla_model_check.py``, in an environment with ``flash-linear-attention`` installed: ``package_environments``)
with no missing, unexpected or misshapen tensor, and its logits are the JAX model's within
``LOGIT_TOLERANCE``. On a machine without a GPU fla's Triton operations run as the PyTorch stand-ins that
``fla_model_check.py`` names (the recurrences as fla's own naive references). The rest: the export reads back
bitwise, and what fla's layout cannot hold exactly is refused by name, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from export_parity import LOGIT_TOLERANCE, jax_logits, jax_model, random_params
from flax import nnx
from package_environments import package_environment, run_checked

import export as export_entry
from seqmodels.config import Config, ModelConfig
from seqmodels.config_io import save_config
from seqmodels.errors import HFFormatError
from seqmodels.hf.export import export_model
from seqmodels.hf.fla import CONVOLUTIONS, model_config_from_hf
from seqmodels.hf.formats import export_format, load_pretrained
from seqmodels.mixers.deltanet import DeltaNetConfig, deltanet_shape

FLA = "flash-linear-attention==0.6.0"
CHECK = "fla_model_check.py"  # run by the fla environment's python
VOCAB, LENGTH = 258, 24  # the byte-level tokenizer's 258 ids


def fla_config(mixer: str, *, tied: bool) -> ModelConfig:
    """Two layers of ``mixer`` at d_model 64, 4 heads of key width 16 and value width 32 (fla's expand_v 2)."""
    return ModelConfig(vocab_size=VOCAB, d_model=64, num_heads=4, mixers=(mixer, mixer), max_seq_len=128,
                       tie_embeddings=tied, deltanet=DeltaNetConfig(value_head_dim=32))


def without_conv_biases(params: dict) -> dict:
    """``params`` with every q/k/v convolution bias zero (what fla's ShortConvolution holds)."""
    params = jax.tree.map(lambda leaf: leaf, params)
    for block in params["blocks"].values():
        for conv in CONVOLUTIONS:
            block["mixer"][conv]["bias"] = jnp.zeros_like(block["mixer"][conv]["bias"])
    return params


@pytest.fixture(scope="module")
def fla_python():
    bin_dir = package_environment("fla-0.6.0", FLA, "__import__('fla').__version__", "0.6.0")
    return bin_dir / "python"


@pytest.mark.slow  # builds the fla environment once (pip), then ~10 s a case
@pytest.mark.parametrize("mixer,tied", [("gated_deltanet", True), ("deltanet", False)])
def test_fla_loads_the_export_strictly_and_gives_the_jax_logits(tmp_path, fla_python, mixer, tied):
    config = fla_config(mixer, tied=tied)
    params = without_conv_biases(random_params(config))
    tokens = np.asarray(jax.random.randint(jax.random.key(3), (2, LENGTH), 0, VOCAB), np.int32)
    logits = np.asarray(jax_logits(jax_model(config, params), jnp.asarray(tokens)))
    directory = export_model(config, params, tmp_path / "fla", tokenizer="byte", format_name="fla")
    np.savez(tmp_path / "expected.npz", tokens=tokens, logits=logits)
    hf_config = json.loads((directory / "config.json").read_text())
    assert hf_config["model_type"] == {"gated_deltanet": "gated_deltanet", "deltanet": "delta_net"}[mixer]
    assert (hf_config["bos_token_id"], hf_config["eos_token_id"]) == (256, 257)
    assert (directory / "tokenizer.json").is_file()
    output = run_checked([str(fla_python), str(Path(__file__).with_name(CHECK)),
                          str(directory), str(tmp_path / "expected.npz")], "loading the export with fla")
    result = json.loads(next(line for line in output.splitlines() if line.startswith("result: "))[len("result: "):])
    assert result["class"] == {"gated_deltanet": "GatedDeltaNetForCausalLM", "deltanet": "DeltaNetForCausalLM"}[mixer]
    assert (result["missing"], result["unexpected"], result["mismatched"]) == ([], [], [])
    assert result["max_abs_logit"] > 1.0  # the logits are O(1), so the float32 tolerance is a real bound
    assert result["max_logit_error"] < LOGIT_TOLERANCE, result


@pytest.mark.parametrize("mixer,tied", [("gated_deltanet", False), ("deltanet", True)])
def test_an_fla_export_reads_back_bitwise(tmp_path, mixer, tied):
    config = fla_config(mixer, tied=tied)
    params = without_conv_biases(random_params(config))
    loaded = load_pretrained(export_model(config, params, tmp_path / "fla", format_name="fla"), base=config)
    # the widths come back explicit (d_ff, deltanet.head_dim), the same architecture
    assert (loaded.config.mlp_hidden, deltanet_shape(loaded.config)) == (config.mlp_hidden, deltanet_shape(config))
    assert dataclasses.replace(loaded.config, d_ff=config.d_ff, deltanet=config.deltanet) == config
    expected = dict(jax.tree_util.tree_leaves_with_path(params))
    read = dict(jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.state(loaded, nnx.Param))))
    assert read.keys() == expected.keys()
    for path, leaf in expected.items():
        np.testing.assert_array_equal(np.asarray(read[path]), np.asarray(leaf), err_msg=str(path))


def test_a_nonzero_convolution_bias_is_refused_by_name_and_nothing_is_written(tmp_path):
    config = fla_config("gated_deltanet", tied=True)
    params = without_conv_biases(random_params(config))
    params["blocks"][1]["mixer"]["k_conv"]["bias"] = params["blocks"][1]["mixer"]["k_conv"]["bias"].at[3].set(0.5)
    with pytest.raises(HFFormatError, match=r"layer 1: mixer\.k_conv\.bias is not zero"):
        export_model(config, params, tmp_path / "fla", format_name="fla")
    assert not (tmp_path / "fla").exists()


@pytest.mark.parametrize("change,message", [
    (dict(mixers=("gated_deltanet", "attention")), "layer 1 is mixer 'attention'"),
    (dict(mixers=("gated_deltanet", "deltanet")), "layer 1 is mixer 'deltanet'"),
    (dict(mlp=False), "model.mlp = False"),
])
def test_a_config_fla_cannot_hold_is_refused_by_its_setting(change, message):
    with pytest.raises(HFFormatError, match=message):
        export_format(dataclasses.replace(fla_config("gated_deltanet", tied=True), **change), "fla")


def test_fla_is_written_only_when_named():
    assert export_format(fla_config("gated_deltanet", tied=True)) == "seqmodels"
    with pytest.raises(HFFormatError, match="export format 'flax' is not one of"):
        export_format(fla_config("gated_deltanet", tied=True), "flax")


@pytest.mark.parametrize("field,value", [("allow_neg_eigval", True), ("use_gate", False), ("use_short_conv", False),
                                         ("output_gate_activation", "sigmoid"), ("num_v_heads", 8)])
def test_an_fla_config_field_the_project_does_not_implement_is_refused_by_name(field, value):
    hf = {"model_type": "gated_deltanet", "hidden_size": 64, "num_heads": 4, "head_dim": 16, "expand_v": 2.0,
          "num_hidden_layers": 2, "vocab_size": VOCAB, field: value}
    with pytest.raises(HFFormatError, match=field):
        model_config_from_hf(hf)


def test_export_py_format_fla_exits_2_naming_the_mixer(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    save_config(Config(model=ModelConfig(mixers=("attention",))), run / "config.yaml")
    assert export_entry.main(["--run", str(run), "--out", str(tmp_path / "out"), "--format", "fla"]) == 2
    assert "layer 0 is mixer 'attention'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
