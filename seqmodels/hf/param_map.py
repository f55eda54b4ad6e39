"""Hugging Face Llama / Qwen2 tensor names <-> the project's parameter paths, and the layout change of each.

PyTorch ``nn.Linear`` stores ``W [out, in]`` and computes ``x W^T``; the project's ``Dense`` stores
``kernel [in, *out]`` (heads split out) and computes ``x kernel``. So, per layer ``i``
(``model.layers.{i}.`` in Hugging Face, ``blocks/{i}/`` here):

    self_attn.q_proj.weight [H Dh, D]  -> mixer/query/kernel [D, H, Dh]    = W^T reshaped   (k, v: Hkv)
    self_attn.q_proj.bias   [H Dh]     -> mixer/query/bias   [H, Dh]                         (Qwen2)
    self_attn.o_proj.weight [D, H Dh]  -> mixer/out/kernel   [H, Dh, D]    = W^T reshaped
    mlp.{gate,up}_proj.weight [F, D]   -> mlp/{gate,up}/kernel [D, F]      = W^T
    mlp.down_proj.weight    [D, F]     -> mlp/down/kernel    [F, D]        = W^T
    input_layernorm / post_attention_layernorm.weight -> mixer_norm / mlp_norm /scale

and ``model.embed_tokens.weight [V, D] -> embed``, ``model.norm.weight -> final_norm/scale``,
``lm_head.weight [V, D] -> head [D, V]`` (absent with tied embeddings). Each rule is a bijection, so
an export loads back bitwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from seqmodels.config import ModelConfig

Path = tuple  # a path into the nested parameter dict, e.g. ("blocks", 0, "mixer", "query", "kernel")


@dataclass(frozen=True)
class TensorRule:
    """One Hugging Face tensor: its name, the parameter path it fills, and the two layout maps."""

    hf_name: str
    path: Path
    to_project: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]


def _same(x):
    return x


def _projection_in(heads: int, head_dim: int):
    """``W [heads * head_dim, D]`` <-> ``kernel [D, heads, head_dim]``."""
    return (lambda w: w.T.reshape(w.shape[1], heads, head_dim),
            lambda k: k.reshape(k.shape[0], heads * head_dim).T)


def _bias(heads: int, head_dim: int):
    return lambda b: b.reshape(heads, head_dim), lambda b: b.reshape(heads * head_dim)


def _projection_out(heads: int, head_dim: int):
    """``W [D, heads * head_dim]`` <-> ``kernel [heads, head_dim, D]``."""
    return (lambda w: w.T.reshape(heads, head_dim, w.shape[0]),
            lambda k: k.reshape(heads * head_dim, k.shape[-1]).T)


def _transpose():
    return (lambda w: w.T, lambda k: k.T)


def _layer_rules(layer: int, config: ModelConfig) -> list[TensorRule]:
    heads, kv_heads = config.num_heads, config.attention.num_kv_heads or config.num_heads
    head_dim = config.attention_head_dim
    hf, ours = f"model.layers.{layer}.", ("blocks", layer)
    maps = {
        "self_attn.q_proj.weight": (("mixer", "query", "kernel"), _projection_in(heads, head_dim)),
        "self_attn.k_proj.weight": (("mixer", "key", "kernel"), _projection_in(kv_heads, head_dim)),
        "self_attn.v_proj.weight": (("mixer", "value", "kernel"), _projection_in(kv_heads, head_dim)),
        "self_attn.o_proj.weight": (("mixer", "out", "kernel"), _projection_out(heads, head_dim)),
        "mlp.gate_proj.weight": (("mlp", "gate", "kernel"), _transpose()),
        "mlp.up_proj.weight": (("mlp", "up", "kernel"), _transpose()),
        "mlp.down_proj.weight": (("mlp", "down", "kernel"), _transpose()),
        "input_layernorm.weight": (("mixer_norm", "scale"), (_same, _same)),
        "post_attention_layernorm.weight": (("mlp_norm", "scale"), (_same, _same)),
    }
    if config.attention.qkv_bias:
        maps.update({
            "self_attn.q_proj.bias": (("mixer", "query", "bias"), _bias(heads, head_dim)),
            "self_attn.k_proj.bias": (("mixer", "key", "bias"), _bias(kv_heads, head_dim)),
            "self_attn.v_proj.bias": (("mixer", "value", "bias"), _bias(kv_heads, head_dim)),
        })
    return [TensorRule(hf + name, ours + path, *layout) for name, (path, layout) in maps.items()]


def tensor_rules(config: ModelConfig) -> list[TensorRule]:
    """Every tensor of the Hugging Face checkpoint of ``config`` (a Transformer++ ``ModelConfig``)."""
    rules = [TensorRule("model.embed_tokens.weight", ("embed",), _same, _same)]
    for layer in range(len(config.mixers)):
        rules += _layer_rules(layer, config)
    rules.append(TensorRule("model.norm.weight", ("final_norm", "scale"), _same, _same))
    if not config.tie_embeddings:
        rules.append(TensorRule("lm_head.weight", ("head",), *_transpose()))
    return rules


def get_path(tree: dict, path: Path):
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict, path: Path, value) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value
