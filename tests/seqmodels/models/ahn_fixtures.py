"""Tiny random Llama-shaped bases for the AHN tests (written with the project's own Hugging Face export)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.config_ahn import AHNConfig
from seqmodels.hf.base import start_params
from seqmodels.hf.export import export_model
from seqmodels.mixers.attention import AttentionConfig
from seqmodels.models import build_model


def tiny_base_config(**changes) -> ModelConfig:
    """3 layers, d_model 64, 4 query heads over 2 key/value heads (GQA), vocab 97, untied head."""
    values = dict(vocab_size=97, d_model=64, num_heads=4, mixers=("attention",) * 3, d_ff=96, max_seq_len=512,
                  tie_embeddings=False, attention=AttentionConfig(num_kv_heads=2), init_std=0.2,
                  kernel_impl="xla")
    values.update(changes)
    return ModelConfig(**values)


def write_tiny_base(directory, seed: int = 0, **changes):
    """``(directory, LM config, LM params)``: a random Transformer++ exported as a Hugging Face Llama."""
    config = tiny_base_config(**changes)
    lm = build_model(config, seed=seed)
    params = nnx.to_pure_dict(nnx.state(lm, nnx.Param))
    export_model(config, params, directory)
    return directory, config, params


def ahn_model(base_dir, base_config: ModelConfig, *, compressor="gated_deltanet", window=16, sinks=4,
              random_readout: float = 0.0, seed: int = 1, **ahn):
    """An AHN model over the base at ``base_dir``; ``random_readout`` > 0 replaces the zero read-out maps by
    normal draws of that scale (so the compressors' outputs are visible)."""
    settings = AHNConfig(base=str(base_dir), compressor=compressor, window=window, sinks=sinks, chunk_size=16,
                         **ahn)
    config = dataclasses.replace(base_config, kind="ahn", ahn=settings)
    model = build_model(config, seed=seed)
    params = start_params(config, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    if random_readout:
        keys = iter(jax.random.split(jax.random.key(seed + 7), 64))
        for block in params["blocks"].values():
            block["ahn"]["readout"] = random_readout * jax.random.normal(next(keys), block["ahn"]["readout"].shape)
    graphdef, _ = nnx.split(model)
    return nnx.merge(graphdef, params), params


def tokens(batch: int, length: int, vocab: int = 97, seed: int = 0):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, dtype=jnp.int32)
