"""A model that starts from pretrained weights never trains at the from-scratch learning rate unless asked."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import train as train_entry
from conftest import tiny_overrides, write_corpus
from seqmodels.config import Config, ModelConfig, OptimConfig
from seqmodels.config_ahn import AHNConfig
from seqmodels.hf.base import resolve_learning_rate
from seqmodels.models.kinds import AHN_COMPRESSOR_LR, CONTINUED_PRETRAINING_LR

ROOT = Path(__file__).resolve().parents[3]


def test_init_from_takes_the_continued_pretraining_rate_and_says_so():
    config = Config(model=ModelConfig(init_from="hf:some/dir"))
    resolved, note = resolve_learning_rate(config, learning_rate_set=False)
    assert resolved.optim.learning_rate == CONTINUED_PRETRAINING_LR == 5e-5 != OptimConfig().learning_rate
    assert "optim.learning_rate=5e-05: the default for a model that starts from model.init_from=hf:some/dir" in note
    assert resolved.optim == dataclasses.replace(config.optim, learning_rate=5e-5)  # nothing else changes


def test_a_learning_rate_the_user_set_is_kept_and_logged():
    config = Config(model=ModelConfig(init_from="hf:some/dir"), optim=OptimConfig(learning_rate=3e-3))
    resolved, note = resolve_learning_rate(config, learning_rate_set=True)
    assert resolved is config and "optim.learning_rate=0.003 (as set)" in note


def test_an_ahn_base_takes_the_compressor_rate_and_a_fresh_model_is_untouched():
    ahn = Config(model=ModelConfig(kind="ahn", ahn=AHNConfig(base="some/base")))
    assert resolve_learning_rate(ahn, learning_rate_set=False)[0].optim.learning_rate == AHN_COMPRESSOR_LR
    fresh = Config()
    assert resolve_learning_rate(fresh, learning_rate_set=False) == (fresh, None)


@pytest.mark.slow
def test_train_py_from_init_from_runs_at_the_continued_pretraining_rate(tmp_path, capsys):
    from seqmodels.hf.export import export_model
    from seqmodels.models import abstract_model
    from flax import nnx
    import jax
    model = ModelConfig(d_model=32, num_heads=2, mixers=("attention",) * 2, max_seq_len=64)
    _, state = abstract_model(model)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(0, 0.02, x.shape).astype(np.float32), nnx.to_pure_dict(state))
    base = export_model(model, params, tmp_path / "base")
    corpus = str(write_corpus(tmp_path / "corpus") / "*.txt")
    overrides = [o for o in tiny_overrides(tmp_path / "run", corpus, train__steps=2)
                 if not o.startswith(("model.d_model", "model.num_heads", "model.mixers"))]
    assert train_entry.main([*overrides, f"model.init_from=hf:{base}"]) == 0
    assert "optim.learning_rate=5e-05: the default for a model that starts from model.init_from" in capsys.readouterr().out
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["optim"]["learning_rate"] == 5e-5


@pytest.mark.slow
def test_the_readme_init_from_example_keeps_smollm2_answering_paris(tmp_path):
    """The README's continued-pretraining command (3 steps of one 128-token row here), then the chat prompt."""
    from seqmodels.hf import load_tokenizer
    from seqmodels.hf.gguf import convert_gguf, default_gguf_path
    from seqmodels.models.lm import generate
    from seqmodels.runs.load import load_run
    hf = convert_gguf(default_gguf_path(), tmp_path / "smollm2")
    run = tmp_path / "smollm2_run"
    command = [sys.executable, str(ROOT / "train.py"), f"model.init_from=hf:{hf}", f"data.tokenizer=hf:{hf}",
               "data.seq_len=128", "train.batch_size=1", "train.steps=3", f"train.run_dir={run}",
               "log.progress=never", "log.tensorboard=false", "checkpoint.async_save=false"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=1")  # as the README runs it: one CPU device
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "optim.learning_rate=5e-05: the default" in result.stdout
    _, model, step = load_run(run)
    assert step == 3
    tokenizer = load_tokenizer(hf)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids = tokenizer.encode(prompt)
    generated, _ = generate(model, np.asarray([prompt_ids]), 12)
    answer = tokenizer.decode(np.asarray(generated[0, len(prompt_ids):]))
    print(f"after 3 continued-pretraining steps: {answer!r}")
    assert "Paris" in answer, answer
