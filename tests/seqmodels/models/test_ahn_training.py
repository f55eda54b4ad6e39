"""AHN self-distillation: the chunked KL, the random-window recipe, and a train step that moves only compressors."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.nnx import traversals

from seqmodels.models.ahn import trainable_path
from seqmodels.models.ahn_loss import chunked_kl, window_choices
from seqmodels.training.step import make_train_step
from tests.seqmodels.models.ahn_fixtures import ahn_model, tokens, write_tiny_base


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return write_tiny_base(tmp_path_factory.mktemp("ahn_train") / "base")


def test_chunked_kl_equals_the_whole_sequence_kl_and_its_gradient():
    keys = jax.random.split(jax.random.key(0), 4)
    student, teacher = (jax.random.normal(k, (2, 37, 8)) for k in keys[:2])
    head = jax.random.normal(keys[2], (8, 50))
    weights = (jax.random.uniform(keys[3], (2, 37)) > 0.3).astype(jnp.float32)

    def whole(s):
        log_q = jax.nn.log_softmax(s @ head)
        log_p = jax.nn.log_softmax(teacher @ head)
        return jnp.sum(weights * jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1))

    chunked = lambda s: chunked_kl(s, teacher, head, weights, chunk=8)  # noqa: E731  (37 = 4 chunks + 5)
    np.testing.assert_allclose(chunked(student), whole(student), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(chunked)(student), jax.grad(whole)(student), rtol=1e-4, atol=1e-6)
    assert float(chunked_kl(teacher, teacher, head, weights, chunk=8)) == pytest.approx(0.0, abs=1e-5)


def test_window_choices_follow_the_recipe():
    windows, sinks, valid = window_choices(512)
    assert windows.tolist() == [128, 256]
    assert sinks.tolist() == [0, 4, 8, 16, 32, 64, 128]
    for row, window in enumerate(windows.tolist()):
        assert [s for s, ok in zip(sinks.tolist(), valid[row].tolist()) if ok] == [
            s for s in sinks.tolist() if s <= window // 2]


def test_random_window_draws_vary_with_the_step_and_stay_in_the_table(tiny_base):
    directory, base_config, _ = tiny_base
    model, _ = ahn_model(directory, base_config, random_window=True)
    draws = {tuple(int(x) for x in model.train_window({"step": jnp.int32(step)}, 256)) for step in range(40)}
    assert len(draws) > 3
    assert all(window in (64, 128) and sinks <= window // 2 for window, sinks in draws)


@pytest.mark.slow
def test_train_steps_update_only_compressors_and_leave_every_base_parameter_bitwise_unchanged(tiny_base):
    directory, base_config, _ = tiny_base
    model, params = ahn_model(directory, base_config, window=16, sinks=4)
    graphdef = nnx.split(model)[0]
    trained = {path: leaf for path, leaf in traversals.flatten_mapping(params).items() if trainable_path(path)}
    optimizer = optax.adam(1e-2)
    step = jax.jit(make_train_step(graphdef, optimizer, lambda s: 1e-2, trainable=trainable_path))
    state = {"step": jnp.int32(0), "params": params,
             "opt_state": optimizer.init(traversals.unflatten_mapping(trained))}
    opt_paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(state["opt_state"])[0]]
    assert opt_paths and all("'ahn'" in path for path in opt_paths if "count" not in path)
    row = tokens(2, 49)
    batch = {"inputs": row[:, :-1], "targets": row[:, 1:], "loss_mask": jnp.ones((2, 48), jnp.int32)}
    losses = []
    for _ in range(3):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    before, after = traversals.flatten_mapping(params), traversals.flatten_mapping(state["params"])
    assert before.keys() == after.keys()
    for path in before:
        same = np.asarray(before[path]).tobytes() == np.asarray(after[path]).tobytes()
        assert same != trainable_path(path), path  # base: bitwise the same; every compressor leaf: moved
    readout_moved = [np.abs(np.asarray(after[p])).max() for p in after if p[-1] == "readout"]
    assert min(readout_moved) > 0  # the zero read-out maps left zero, so the compressors now speak
    assert losses[0] > 0 and losses[-1] < losses[0]


@pytest.mark.slow
def test_train_distils_an_ahn_model_from_a_base_directory_resumes_and_exports(tmp_path, tiny_corpus):
    from seqmodels.config_io import load_config
    from seqmodels.hf.base import resolve_base
    from seqmodels.runs.load import load_run
    from seqmodels.training.loop import train
    directory, _, base_params = write_tiny_base(tmp_path / "base", vocab_size=320, max_seq_len=256)
    overrides = ["model.kind=ahn", f"model.ahn.base={directory}", "model.ahn.window=16", "model.ahn.sinks=2",
                 "model.ahn.chunk_size=16", "model.ahn.random_window=true", "model.kernel_impl=xla",
                 "data.source=text_files", f"data.path={tiny_corpus}", "data.seq_len=64", "data.heldout_fraction=0.2",
                 "train.batch_size=8", "train.steps=3", f"train.run_dir={tmp_path / 'run'}", "optim.warmup_steps=1",
                 "log.progress=never", "log.tensorboard=false", "checkpoint.async_save=false",
                 "checkpoint.every_steps=3"]
    config = resolve_base(load_config(None, overrides))
    assert config.model.d_model == 64 and config.model.attention.num_kv_heads == 2 and config.model.kind == "ahn"
    summary = train(config)
    assert summary["end_step"] == 3 and np.isfinite(summary["last_loss"])
    _, model, step = load_run(tmp_path / "run")
    saved = traversals.flatten_mapping(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    for path, leaf in traversals.flatten_mapping(base_params).items():
        assert np.asarray(saved[path]).tobytes() == np.asarray(leaf).tobytes(), path
    longer = [item.replace("train.steps=3", "train.steps=4") for item in overrides]
    again = train(resolve_base(load_config(None, longer + ["checkpoint.allow_changes=[train.steps]"])))
    assert again["start_step"] == 3 and again["end_step"] == 4
    import eval as eval_entry  # the entry point, on the trained run
    out = tmp_path / "eval.json"
    assert eval_entry.main(["--run", str(tmp_path / "run"), "--suites", "ahn", "--ahn-window", "80",
                            "--ahn-multiples", "2,3", "--max-batches", "2", "--batch-size", "1", "--needles", "2",
                            "--out", str(out)]) == 0
    result = json.loads(out.read_text())["ahn"]
    assert [row["length"] for row in result["loss"]] == [160, 240]
    assert all(row["teacher"] > 0 and row["swa"] > 0 and row["ahn"] > 0 for row in result["loss"])
    for row in result["loss"]:  # two rows each: an interval per model around its mean, and the recovered share
        assert row["rows"] == 2
        assert all(row["interval"][mode]["low"] <= row[mode] <= row["interval"][mode]["high"]
                   for mode in ("teacher", "swa", "ahn"))
        share = (row["swa"] - row["ahn"]) / (row["swa"] - row["teacher"])
        assert row["recovered"]["share"] == pytest.approx(share, rel=1e-6)
        assert row["recovered"]["interval"]["units"] == 2
    assert "| 160 |" in out.with_name("eval_ahn.md").read_text()
    assert eval_entry.main(["--run", str(tmp_path / "run"), "--suites", "ahn", "--ahn-window", "200",
                            "--out", str(tmp_path / "bad.json")]) == 2  # 2 x 200 > model.max_seq_len
    _exports_to_pytorch(tmp_path / "run", tmp_path / "hf")


def _exports_to_pytorch(run, out):
    """``export.py`` on the trained run: ``model_type: seqmodels`` with the base's and the compressors' weights,
    read back bitwise, and its PyTorch logits beyond the window equal to the JAX student's."""
    import torch

    import export as export_entry
    from seqmodels.runs.load import load_run
    from seqmodels.hf import load_pretrained
    from tests.seqmodels.hf.torch.export_parity import LOGIT_TOLERANCE, load_torch
    assert export_entry.main(["--run", str(run), "--out", str(out)]) == 0
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["model_type"] == "seqmodels" and hf_config["model"]["kind"] == "ahn"
    _, model, _ = load_run(run)
    params = traversals.flatten_mapping(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    loaded = traversals.flatten_mapping(nnx.to_pure_dict(nnx.state(load_pretrained(out), nnx.Param)))
    assert sorted(loaded) == sorted(params) and any("ahn" in path for path in params)
    for path, leaf in params.items():
        assert np.asarray(loaded[path]).tobytes() == np.asarray(leaf).tobytes(), path
    row = tokens(1, 48, vocab=model.config.vocab_size)
    with torch.no_grad():
        torch_logits = load_torch(out)(torch.as_tensor(np.array(row))).logits.numpy()
    assert np.abs(torch_logits - np.asarray(model(row)[0])).max() < LOGIT_TOLERANCE


def test_the_ahn_suite_refuses_a_window_at_or_beyond_the_evaluation_length():
    from seqmodels.config import Config, ConfigError, ModelConfig
    from seqmodels.config_ahn import AHNConfig
    from seqmodels.evaluation.ahn import check_window
    config = Config(model=ModelConfig(kind="ahn", ahn=AHNConfig(window=64, sinks=4), max_seq_len=512))
    check_window(config, 64, [128, 256, 512])
    with pytest.raises(ConfigError, match=r"^model\.ahn\.window=64 must be below the evaluation length 64"):
        check_window(config, 64, [64])
    with pytest.raises(ConfigError, match=r"^evaluation length 1024 exceeds model\.max_seq_len=512"):
        check_window(config, 128, [1024])


def test_the_ahn_cache_is_a_fixed_fraction_of_full_attention_and_flops_stay_flat(tiny_base):
    from seqmodels.config import Config
    from seqmodels.evaluation.ahn import cost
    directory, base_config, _ = tiny_base
    model, _ = ahn_model(directory, base_config, window=16, sinks=4)
    result = cost(model, Config(model=model.config), 16)
    layers, kv_heads, head_dim, heads = 3, 2, 16, 4
    for length, row in result.items():
        # k, v and slot positions per layer, and the int32 decoding position
        full = layers * 2 * int(length) * kv_heads * head_dim * 4 + layers * int(length) * 4 + 4
        assert row["cache_bytes"]["full_attention"] == full
        # per slot k, v, two gates per head and a position; the [H, Dh, Dh] state; the decoding position
        window_part = layers * (16 * (2 * kv_heads * head_dim * 4 + 2 * heads * 4 + 4) + heads * head_dim ** 2 * 4) + 4
        assert row["cache_bytes"]["ahn"] == window_part
    # flat up to the first window of positions, which see fewer keys (a 1e-5 effect at 32k tokens)
    assert result["32768"]["flops_per_token"]["ahn"] == pytest.approx(result["131072"]["flops_per_token"]["ahn"], rel=1e-4)
    assert result["131072"]["flops_per_token"]["ahn_over_full"] < result["32768"]["flops_per_token"]["ahn_over_full"]
