"""The JAX parameter paths <-> the tensor names and ``[out, in]`` layouts of the exported PyTorch modules.

One rule per parameter of the (unscanned) model, decided by the layer that owns it, so every mixer
(and a future one made of the same layers) maps without a table of its own. The PyTorch name is
``model.`` + the JAX path joined by dots, with the layer's own leaf names:

    Dense     kernel [in, *out] -> <path>.weight [prod(out), in]  = kernel.reshape(in, -1).T   (nn.Linear)
              bias   [*out]     -> <path>.bias   [prod(out)]
    DenseOut  kernel [*in, out] -> <path>.weight [out, prod(in)]  = kernel.reshape(-1, out).T
    ShortConv weight [K, C]     -> <path>.weight [C, 1, K]        = weight.T[:, None, ::-1]    (depthwise conv1d)
              bias   [C]        -> <path>.bias
    RMSNorm   scale  [C]        -> <path>.weight
    embed [V, D] -> model.embed.weight (nn.Embedding);  head [D, V] -> lm_head.weight [V, D] = head.T

and every other parameter (decays, skips, initial memories, the pad embedding) keeps its name and
layout. Each map is a transpose, reshape or flip: a bijection, so an export reads back bitwise.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.hf.param_map import TensorRule
from seqmodels.layers.common import Dense, DenseOut
from seqmodels.layers.conv import ShortConv
from seqmodels.layers.norms import RMSNorm


def _same(x):
    return x


def _dense_kernel(shape):
    return lambda k: k.reshape(k.shape[0], -1).T, lambda w: w.T.reshape(shape)


def _dense_out_kernel(shape):
    return lambda k: k.reshape(-1, k.shape[-1]).T, lambda w: w.T.reshape(shape)


def _flat(shape):
    return lambda b: b.reshape(-1), lambda b: b.reshape(shape)


def _conv_weight(shape):
    return lambda w: w.T[:, None, ::-1], lambda t: t[:, 0, ::-1].T


# owning layer -> {JAX leaf name: (PyTorch leaf name, layout maker(shape) -> (to_torch, to_jax))}
LAYER_LEAVES = {
    Dense: {"kernel": ("weight", _dense_kernel), "bias": ("bias", _flat)},
    DenseOut: {"kernel": ("weight", _dense_out_kernel)},
    ShortConv: {"weight": ("weight", _conv_weight), "bias": ("bias", lambda shape: (_same, _same))},
    RMSNorm: {"scale": ("weight", lambda shape: (_same, _same))},
}
TOP_LEVEL = {("embed",): ("model.embed.weight", lambda shape: (_same, _same)),
             ("head",): ("lm_head.weight", lambda shape: (lambda h: h.T, lambda w: w.T))}


def abstract_unscanned_model(config: ModelConfig) -> nnx.Module:
    """The model of ``config`` with one module per layer (``scan_layers`` off), shapes only."""
    from seqmodels.models import build_model
    return nnx.eval_shape(lambda: build_model(dataclasses.replace(config, scan_layers=False)))


def _rule(path: tuple, shape: tuple, owner) -> TensorRule:
    if path in TOP_LEVEL:
        name, layout = TOP_LEVEL[path]
        return TensorRule(name, path, *reversed(layout(shape)))
    leaves = LAYER_LEAVES.get(type(owner), {})
    leaf, layout = leaves.get(path[-1], (str(path[-1]), lambda shape: (_same, _same)))
    to_torch, to_jax = layout(shape)
    return TensorRule(".".join(["model", *map(str, path[:-1]), leaf]), path, to_jax, to_torch)


def torch_tensor_rules(config: ModelConfig) -> list[TensorRule]:
    """One rule per parameter of ``config``'s model (unscanned layout): ``hf_name`` is the PyTorch name,
    ``to_hf`` maps a JAX array to the PyTorch layout and ``to_project`` back."""
    model = abstract_unscanned_model(config)
    owners = {tuple(path): node for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Module)}
    rules = []
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        path = tuple(path)
        rules.append(_rule(path, tuple(variable.get_value().shape), owners.get(path[:-1])))
    names = [rule.hf_name for rule in rules]
    if len(set(names)) != len(names):
        raise ValueError(f"two parameters map to one PyTorch name: {sorted(n for n in names if names.count(n) > 1)}")
    return rules


def torch_shape(rule: TensorRule, jax_shape: tuple) -> tuple:
    """The PyTorch tensor shape of a parameter of ``jax_shape`` under ``rule``."""
    return tuple(np.shape(rule.to_hf(np.empty(jax_shape, np.uint8))))
