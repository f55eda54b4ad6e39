"""The exported twins select CUDA kernels at load time and run them for the layers they match
(``seqmodels.hf.torch.kernels``), with the pure-PyTorch path as the fallback.

Selection (no GPU here): without CUDA nothing is selected even where the package imports; with CUDA (patched
on) a package that imports is selected by name and one that does not is not; a kernel runs only for chunked
calls, on its own devices, and never with ``set_kernels(model, False)``.

The kernels' interface (slow, in an environment with flash-linear-attention 0.6.0): every export whose layers
match fla's ``chunk_gated_delta_rule``, ``chunk_delta_rule`` or ``chunk_simple_gla`` (Gated DeltaNet, DeltaNet,
Mamba2, the three AHN compressors) gives the pure path's logits, decoded logits from a chunked prefill and
parameter gradients when its recurrences go through fla's function signatures to fla's own PyTorch references
(``kernels_check.py`` says why stand-ins: Triton needs a GPU). Tolerances: 1e-5 max abs on O(1) float32 logits,
and relative to max(1, |g|) on gradients: the two paths sum the same terms in another order.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
from export_parity import BASE_CONFIG, ROOT, random_params, tiny_config
from package_environments import package_environment, run_checked

TOLERANCE = 1e-5
FLA = "flash-linear-attention==0.6.0"
FLA_MIXERS = {"gated_deltanet": "gated_delta_rule", "deltanet": "delta_rule", "mamba2": "simple_gla",
              "ahn_gated_deltanet": "gated_delta_rule", "ahn_deltanet": "gated_delta_rule",
              "ahn_mamba2": "simple_gla"}


def _config(name: str):
    if name.startswith("ahn_"):
        return tiny_config(ROOT / "configs" / f"{name}.yaml")
    return dataclasses.replace(tiny_config(BASE_CONFIG), mixers=(name, name))


def _export(tmp_path, name: str) -> Path:
    from seqmodels.hf.export import export_model
    config = _config(name)
    return export_model(config, random_params(config), tmp_path / name)


def _load(directory):
    """The export built from the repository's ``seqmodels.hf.torch`` (whose kernel table the test sets), not from
    the copy that ``trust_remote_code`` imports under another module name."""
    import torch

    from seqmodels.hf.torch.lm import SeqmodelsForCausalLM
    torch.set_num_threads(1)
    return SeqmodelsForCausalLM.from_pretrained(directory).eval()


@pytest.fixture
def kernels():
    """``seqmodels.hf.torch.kernels``, its table of found kernels restored afterwards."""
    from seqmodels.hf.torch import kernels as module
    saved = dict(module._FOUND)
    module._FOUND.clear()
    yield module
    module._FOUND.clear()
    module._FOUND.update(saved)


def test_nothing_is_selected_without_cuda_even_where_the_package_imports(kernels, monkeypatch):
    import torch
    package = types.ModuleType("fla.ops.gated_delta_rule")
    package.chunk_gated_delta_rule = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", package)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kernels.find_kernel("gated_delta_rule") is None


def test_with_cuda_a_package_that_imports_is_selected_by_name_and_a_missing_one_is_not(kernels, monkeypatch):
    import torch
    package = types.ModuleType("fla.ops.gated_delta_rule")
    package.chunk_gated_delta_rule = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", package)
    monkeypatch.setitem(sys.modules, "fla.ops.simple_gla", None)  # an import of it raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    found = kernels.find_kernel("gated_delta_rule")
    assert found.name == "fla.ops.gated_delta_rule.chunk_gated_delta_rule" and found.devices == ("cuda",)
    assert found.function is package.chunk_gated_delta_rule
    assert kernels.find_kernel("simple_gla") is None


def test_a_kernel_runs_for_chunked_calls_on_its_devices_and_never_when_turned_off(tmp_path, kernels):
    import torch

    from seqmodels.hf.torch.chunked import set_scan_form
    from seqmodels.hf.torch.lm import CACHE_FIELD
    from seqmodels.hf.torch.recurrences import delta_rule_scan
    calls = []

    def recording(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **unused):
        calls.append(q.shape[1])
        return delta_rule_scan(q, k, v, beta, g, initial_state)

    directory = _export(tmp_path, "gated_deltanet")
    kernels.register_kernel("gated_delta_rule", recording, devices=("cpu",), name="recording")
    model = _load(directory)
    assert kernels.kernels_in(model) == {"gated_delta_rule": "recording"}
    ids = torch.randint(0, model.config.vocab_size, (1, 21))
    set_scan_form(model, "auto", chunk_size=8)
    with torch.no_grad():
        chunked = model(ids).logits
        assert calls == [21, 21]  # one call a layer
        output = model(ids[:, :20], use_cache=True)
        calls.clear()
        model(ids[:, 20:], use_cache=True, **{CACHE_FIELD: getattr(output, CACHE_FIELD)})
        assert calls == []  # a decoded token takes the recurrent step
        assert kernels.set_kernels(model, False) == 2 + 3 * 2  # two mixers, three convolutions each
        pure = model(ids).logits
        assert calls == []
    assert float((chunked - pure).abs().max()) < TOLERANCE

    kernels.register_kernel("gated_delta_rule", recording, devices=("cuda",), name="recording")
    calls.clear()
    with torch.no_grad():
        _load(directory)(ids)
    assert calls == []  # tensors on the CPU: the pure path


def test_kernel_settings_refuse_unknown_ops_devices_and_switches(kernels):
    import torch
    with pytest.raises(ValueError, match="unknown kernel op 'flash'; ops: gated_delta_rule, delta_rule"):
        kernels.register_kernel("flash", print)
    with pytest.raises(ValueError, match="unknown kernel op 'flash'"):
        kernels.find_kernel("flash")
    with pytest.raises(ValueError, match="need a callable and a non-empty tuple of device types"):
        kernels.register_kernel("ssd", print, devices=())
    with pytest.raises(ValueError, match="enabled must be True or False, got 'off'"):
        kernels.set_kernels(torch.nn.Linear(2, 2), "off")


MAMBA = ["mamba_ssm==2.3.2.post1", "causal_conv1d==1.6.1", "einops==0.8.1"]
# Their sources build CUDA extensions unless told not to (and then import torch to build: no isolation).
MAMBA_BUILD = {"MAMBA_SKIP_CUDA_BUILD": "TRUE", "MAMBA_FORCE_BUILD": "TRUE", "CAUSAL_CONV1D_SKIP_CUDA_BUILD": "TRUE",
               "CAUSAL_CONV1D_FORCE_BUILD": "TRUE"}
MAMBA_MIXERS = {"mamba2": ["ssd", "causal_conv1d"], "gated_deltanet": ["causal_conv1d"]}


def _check(python, packages: str, directories: dict) -> dict:
    import os
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    output = run_checked([str(python), str(Path(__file__).with_name("kernels_check.py")), packages,
                          *map(str, directories.values())], f"running the twins through {packages}", env=environment)
    return json.loads(next(line for line in output.splitlines() if line.startswith("result: "))[len("result: "):])


@pytest.fixture(scope="module")
def fla_python():
    bin_dir = package_environment("fla-0.6.0", FLA, "__import__('fla').__version__", "0.6.0")
    return bin_dir / "python"


@pytest.mark.slow  # the fla environment (built once, shared with test_fla_export), then ~20 s
def test_every_layer_fla_matches_gives_the_pure_path_through_fla_s_interface(tmp_path, fla_python):
    directories = {name: _export(tmp_path, name) for name in FLA_MIXERS}
    results = _check(fla_python, "fla", directories)
    for name, directory in directories.items():
        _assert_equal_paths(name, results[str(directory)], [FLA_MIXERS[name]], "fla ")


@pytest.mark.slow  # builds mamba_ssm and causal_conv1d from source without CUDA once (~1 min), then ~10 s
def test_mamba2_and_the_short_convolutions_give_the_pure_path_through_mamba_ssm_and_causal_conv1d(tmp_path):
    python = package_environment("mamba_ssm-2.3.2", MAMBA, "__import__('importlib.metadata').metadata.version("
                                 "'mamba_ssm')", "2.3.2.post1", pip_options=("--no-build-isolation",),
                                 build_environment=MAMBA_BUILD) / "python"
    directories = {name: _export(tmp_path, name) for name in MAMBA_MIXERS}
    results = _check(python, "mamba", directories)
    for name, directory in directories.items():
        _assert_equal_paths(name, results[str(directory)], MAMBA_MIXERS[name], "")


def _assert_equal_paths(name: str, result: dict, ops: list[str], prefix: str) -> None:
    assert sorted(result["kernels"]) == sorted(ops), (name, result)
    assert all(kernel.startswith(prefix) for kernel in result["kernels"].values()), (name, result)
    assert all(result["calls"].get(op, 0) >= 2 for op in ops), (name, result)  # at least one call a layer
    assert result["max_abs_logit"] > 1.0, (name, result)
    assert result["logits"] < TOLERANCE and result["decoded"] < TOLERANCE, (name, result)
    assert result["gradients"] < TOLERANCE and result["gradient_tensors"] > 10, (name, result)
