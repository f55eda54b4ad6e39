"""The seqmodels export as files: self-contained modules, the weight map read back bitwise, bf16, sharded runs,
and ``export.py``'s refusals (each a one-line error, nothing written)."""

import ast
import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import tiny_overrides, write_corpus
from export_parity import BASE_CONFIG, CONFIGS, load_torch, random_params, tiny_config

import export as export_entry
from seqmodels.config import Config, DataConfig, ModelConfig
from seqmodels.config_io import save_config
from seqmodels.hf.torch import SHARED_FILES, exported_files
from seqmodels.hf import load_pretrained
from seqmodels.hf.export import export_model
from seqmodels.hf.safetensors_io import SafetensorsCheckpoint

HYBRID = dataclasses.replace(tiny_config(BASE_CONFIG), mixers=("swa", "gated_deltanet"), tie_embeddings=False)


def _config_of(stem: str) -> ModelConfig:
    return tiny_config(next(path for path in CONFIGS if path.stem == stem))


def _leaves(tree) -> list:
    return [(jax.tree_util.keystr(path), np.asarray(leaf)) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]


def test_every_registered_mixer_has_a_pytorch_module():
    from seqmodels.hf.torch.mixers import MIXERS
    from seqmodels.mixers.registry import MIXERS as JAX_MIXERS
    assert set(MIXERS) == set(JAX_MIXERS)


def test_exported_modules_import_only_torch_transformers_and_each_other():
    """The twins and the constants modules they share with JAX (``SHARED_FILES``, whose standard-library
    imports include ``collections``; ``kernels.py`` looks optional packages up through ``importlib``): nothing of
    seqmodels or JAX, so the remote-code loader can run them."""
    files = exported_files()
    exported = {name[:-len(".py")] for name in files}
    assert set(SHARED_FILES) < set(files) and "modeling_seqmodels.py" in files
    for name, source in files.items():
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = {node.module.split(".")[0]}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 1 and node.module in exported, (name, node.module)
                continue
            else:
                continue
            assert roots <= {"torch", "transformers", "math", "collections", "importlib", "typing", "__future__"}, \
                (name, roots)


def test_the_entry_file_imports_every_exported_module_itself():
    """transformers 4.x copies out of a local export only the modules ``modeling_seqmodels.py`` imports directly."""
    import re
    files = exported_files()
    entry = files["modeling_seqmodels.py"].read_text()
    imported = set(re.findall(r"^from\s+\.(\S+)\s+import", entry, flags=re.MULTILINE))
    assert imported == {name[:-len(".py")] for name in files} - {"modeling_seqmodels"}


@pytest.mark.slow
def test_transformers_loads_the_export_offline_with_every_tensor_used(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = export_model(HYBRID, random_params(HYBRID), tmp_path / "hf")
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["model_type"] == "seqmodels" and hf_config["architectures"] == ["SeqmodelsForCausalLM"]
    assert hf_config["auto_map"]["AutoModelForCausalLM"] == "modeling_seqmodels.SeqmodelsForCausalLM"
    assert hf_config["model"]["mixers"] == ["swa", "gated_deltanet"]
    assert all((out / name).is_file() for name in exported_files())
    for name, source in SHARED_FILES.items():  # the JAX side's constants, copied as they are
        assert (out / name).read_bytes() == source.read_bytes(), name
    model, info = load_torch(out, output_loading_info=True)
    assert type(model).__name__ == "SeqmodelsForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert set(model.state_dict()) == set(SafetensorsCheckpoint(out).names())


def test_the_sliding_window_cache_keeps_only_the_sinks_and_the_window(tmp_path):
    import torch
    config = dataclasses.replace(_config_of("swa"), mixers=("swa",))
    model = load_torch(export_model(config, random_params(config), tmp_path / "hf"))
    window, sinks = config.swa.window, config.swa.num_sinks
    tokens = torch.as_tensor(np.random.default_rng(0).integers(0, config.vocab_size, size=(1, 40)))
    with torch.no_grad():
        output = model(tokens[:, :1], use_cache=True)
        for t in range(1, 40):
            output = model(tokens[:, t:t + 1], cache=output.cache, use_cache=True)
            kept = output.cache.layers[0]["positions"]  # [B, S]: each row's positions
            assert kept[0].tolist() == list(range(min(sinks, t + 1))) + list(range(max(sinks, t + 1 - window), t + 1))
    assert output.cache.seen == 40


def _tensor_bytes(tree) -> int:
    import torch
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    return sum(_tensor_bytes(value) for value in tree.values()) if isinstance(tree, dict) else 0


@pytest.mark.slow
def test_the_ahn_cache_keeps_sinks_ring_and_state_and_does_not_grow(tmp_path):
    """Decoding an AHN export token by token: the attention keeps the sinks and the last ``window - sinks``
    positions, the compressor the non-sink tokens among them (those still to leave), and the cache's bytes
    stay the same from one window on."""
    import torch
    config = _config_of("ahn_gated_deltanet")
    model, info = load_torch(export_model(config, random_params(config), tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    window, sinks = config.ahn.window, config.ahn.sinks
    ring, sizes = window - sinks, {}
    tokens = torch.as_tensor(np.random.default_rng(0).integers(0, config.vocab_size, size=(1, 40)))
    with torch.no_grad():
        output = model(tokens[:, :1], use_cache=True)
        for t in range(1, 40):
            output = model(tokens[:, t:t + 1], cache=output.cache, use_cache=True)
            layer = output.cache.layers[0]
            recent = list(range(max(sinks, t + 1 - ring), t + 1))
            assert layer["attention"]["positions"][0].tolist() == list(range(min(sinks, t + 1))) + recent
            assert layer["compressor"]["pending"]["positions"][0].tolist() == recent
            sizes[t] = _tensor_bytes(output.cache.layers[0]) * len(output.cache.layers)
    assert len({sizes[t] for t in range(window, 40)}) == 1, sizes


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    pytest.param(dataclasses.replace(_config_of("atlas_mag"), tie_embeddings=False), id="atlas_mag_untied"),
    pytest.param(dataclasses.replace(_config_of("muonssm_longhorn"), mixers=("muonssm_longhorn", "mamba2", "atlas")),
                 id="muonssm_longhorn_mamba2_atlas"),
    pytest.param(dataclasses.replace(_config_of("looped_cfl"), vocab_size=26), id="looped"),
    *[pytest.param(_config_of(f"ahn_{name}"), id=f"ahn_{name}") for name in ("gated_deltanet", "deltanet", "mamba2")],
])
def test_export_then_load_pretrained_is_bitwise(tmp_path, config):
    params = random_params(config)
    loaded = load_pretrained(export_model(config, params, tmp_path / "hf"))
    assert loaded.config == config
    for (path, expected), (_, got) in zip(_leaves(params), _leaves(nnx_params(loaded))):
        np.testing.assert_array_equal(got, expected, err_msg=path)


def nnx_params(model) -> dict:
    from flax import nnx
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_an_export_missing_a_tensor_or_with_a_wrong_shape_is_refused_naming_it(tmp_path):
    from seqmodels.hf import HFFormatError
    from seqmodels.hf.safetensors_io import write_safetensors
    out = export_model(HYBRID, random_params(HYBRID), tmp_path / "hf")
    checkpoint = SafetensorsCheckpoint(out)
    tensors = {name: np.array(checkpoint.read(name)) for name in checkpoint.names()}
    name = "model.blocks.1.mixer.a_log"
    write_safetensors(out / "model.safetensors", {k: v for k, v in tensors.items() if k != name})
    with pytest.raises(HFFormatError, match=f"tensor '{name}' is missing"):
        load_pretrained(out)
    write_safetensors(out / "model.safetensors", {**tensors, name: np.zeros(3, np.float32)})
    with pytest.raises(HFFormatError, match=f"tensor '{name}' has shape \\[3\\]"):
        load_pretrained(out)


@pytest.mark.slow
def test_a_scanned_model_exports_per_layer_and_loads_back_unscanned(tmp_path):
    from seqmodels.models.stack import unstack_blocks
    scanned = dataclasses.replace(HYBRID, mixers=("swa", "gated_deltanet") * 2, scan_layers=True)
    params = random_params(scanned)
    loaded = load_pretrained(export_model(scanned, params, tmp_path / "hf"))
    assert loaded.config == dataclasses.replace(scanned, scan_layers=False)
    jax.tree.map(np.testing.assert_array_equal, unstack_blocks(params, repeats=2), nnx_params(loaded))


def test_bfloat16_export_loads_with_logits_within_kl_1e3_of_float32(tmp_path):
    import torch
    params = random_params(HYBRID)
    float32 = load_torch(export_model(HYBRID, params, tmp_path / "f32"))
    bfloat16 = load_torch(export_model(HYBRID, params, tmp_path / "bf16", dtype="bfloat16"))
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert all(p.dtype == torch.bfloat16 for p in bfloat16.parameters())
    tokens = torch.as_tensor(np.random.default_rng(0).integers(0, HYBRID.vocab_size, size=(2, 24)))
    with torch.no_grad():
        reference, rounded = float32(tokens).logits, bfloat16(tokens).logits
    assert not torch.equal(reference, rounded)  # the weights were rounded
    kl = torch.sum(torch.softmax(reference, -1) * (torch.log_softmax(reference, -1) - torch.log_softmax(rounded, -1)), -1)
    assert float(kl.max()) < 1e-3, float(kl.max())


@pytest.mark.slow
def test_an_export_from_8_sharded_devices_equals_the_one_device_export(tmp_path):
    from seqmodels.config import MeshConfig
    from seqmodels.sharding import make_mesh
    from seqmodels.training.state import init_params
    assert len(jax.devices()) == 8
    exports = {}
    for name, mesh_config, devices in (("sharded", MeshConfig(data=2, fsdp=2, tensor=2), jax.devices()),
                                       ("one", MeshConfig(data=1), jax.devices()[:1])):
        _, params, _ = init_params(HYBRID, 0, make_mesh(mesh_config, devices))
        if name == "sharded":
            assert max(len(leaf.sharding.device_set) for leaf in jax.tree.leaves(params)) == 8
            assert any(not leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(params))
        exports[name] = export_model(HYBRID, params, tmp_path / name)
    files = sorted(path.name for path in exports["one"].iterdir())
    assert files == sorted(path.name for path in exports["sharded"].iterdir())
    for name in files:
        assert (exports["one"] / name).read_bytes() == (exports["sharded"] / name).read_bytes(), name


def _refused(capsys, argv, message):
    assert export_entry.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_run_without_checkpoints_is_refused_and_nothing_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    save_config(Config(model=HYBRID, data=DataConfig(seq_len=64)), run / "config.yaml")
    _refused(capsys, ["--run", str(run), "--out", str(tmp_path / "hf")], "holds no checkpoints")
    assert not (tmp_path / "hf").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.slow
def test_export_py_exports_a_trained_hybrid_run_and_refuses_bad_steps_and_full_directories(tmp_path, capsys):
    """The run trains sharded over the 8 simulated devices (fsdp 4 x tensor 2); its export equals the export of
    the same weights held on one device."""
    from seqmodels.runs.load import load_run
    import train as train_entry
    run, out = tmp_path / "run", tmp_path / "hf"
    corpus = str(write_corpus(tmp_path / "corpus") / "*.txt")
    overrides = tiny_overrides(run, corpus, train__steps=3, checkpoint__every_steps=3,
                               **{"model.mixers": "[swa, gated_deltanet]", "model.swa.window": 8,
                                  "mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2})
    assert train_entry.main(overrides) == 0
    _refused(capsys, ["--run", str(run), "--out", str(out), "--step", "7"], "no checkpoint at step 7")
    assert not out.exists()
    assert export_entry.main(["--run", str(run), "--out", str(out), "--step", "3"]) == 0
    assert "exported step 3" in capsys.readouterr().out
    config, model, _ = load_run(run)
    for (path, expected), (_, got) in zip(_leaves(nnx_params(model)), _leaves(nnx_params(load_pretrained(out)))):
        np.testing.assert_array_equal(got, expected, err_msg=path)
    one_device = jax.device_put(jax.device_get(nnx_params(model)), jax.devices()[0])
    single = export_model(config.model, one_device, tmp_path / "one_device", tokenizer=config.data.tokenizer)
    for name in sorted(path.name for path in single.iterdir()):
        assert (single / name).read_bytes() == (out / name).read_bytes(), name
    (out / "mine.txt").write_text("keep")
    _refused(capsys, ["--run", str(run), "--out", str(out)], "not an empty directory")
    assert (out / "mine.txt").read_text() == "keep"
    assert export_entry.main(["--run", str(run), "--out", str(out), "--force"]) == 0
    assert not (out / "mine.txt").exists() and (out / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind
