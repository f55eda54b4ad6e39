"""Each model kind (``model.kind``) declared once: what it builds, what a token costs, which parameters train,
which checkpoint it starts from, which evaluation suites measure it and how it exports.

    kind    builds       trains           starts from (its base)                 eval suites              exports as
    lm      LM           every parameter  model.init_from (hf:DIR)               perplexity, recall,      causal LM
                                                                                 cfl, ruler
    looped  LoopedModel  every parameter  nothing                                cfl                      classifier
    ahn     AHNModel     its compressors  model.ahn.base (Hugging Face or run)   ahn, ruler               causal LM

(the cfl suite also needs a run trained on ``data.source=cfl``: ``eval.py``).

A base is a checkpoint that the formats floor reads (``seqmodels.hf.base``); the kind declares which key
names it (``BaseCheckpoint.key``), how this model section takes the base's architecture (``adopt``: the
user's section and the base's decoder-LM section -> the resolved section) and how the base's parameters
enter freshly initialised ones (``merge``). Both are pure functions of what the caller passes down: a
model does no I/O. A Transformer++ ``lm`` exports as a plain Llama / Qwen2 (``seqmodels.hf.llama``);
``export`` names the ``model_type: seqmodels`` class every other model of the kind exports as.

Callers (the loop, the entry points, the sweeps) go through ``model_kind(config)`` and name no kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import jax
from flax import nnx

from seqmodels.config import ConfigError, ModelConfig
from seqmodels.models.ahn import AHNModel, ahn_flops_per_token, trainable_path
from seqmodels.models.lm import LM, lm_flops_per_token
from seqmodels.models.looped import LoopedModel, looped_flops_per_token
from seqmodels.models.trainable import merge_params, split_params


@dataclass(frozen=True)
class BaseCheckpoint:
    """The checkpoint a kind's architecture and weights start from (a kind without one starts afresh)."""

    key: str  # the model key naming it, e.g. "init_from" for model.init_from
    directory: Callable[[str], str]  # the key's value -> the checkpoint's directory ("" = none: start afresh)
    adopt: Callable[[ModelConfig, ModelConfig], ModelConfig]  # (user's section, base's LM section) -> resolved
    merge: Callable[[dict, dict], dict]  # (fresh params, base's params) -> the params training starts from
    # optim.learning_rate when the user sets none (the default 3e-3 is a from-scratch rate) and its source
    learning_rate: float = 0.0
    learning_rate_source: str = ""


# Continued pretraining of every weight of a pretrained decoder: the default of transformers' Trainer
# (TrainingArguments.learning_rate = 5e-5), the usual rate for updating a pretrained checkpoint; the
# from-scratch default (3e-3) wrecks it within a few steps (SmolLM2-135M-Instruct stops answering).
CONTINUED_PRETRAINING_LR = 5e-5
# AHN trains only its fresh compressors over a frozen base: the rate every configs/ahn_*.yaml uses.
AHN_COMPRESSOR_LR = 1e-3


@dataclass(frozen=True)
class ExportClass:
    """The transformers class a ``model_type: seqmodels`` export of the kind loads as."""

    architecture: str  # the class in the export's modeling_seqmodels.py
    auto_class: str  # the transformers Auto class whose auto_map entry names it
    labels: tuple[str, ...] = ()  # a classifier's logit columns, in order (id2label / label2id)


@dataclass(frozen=True)
class ModelKind:
    name: str
    description: str  # what a model of the kind is, for messages ("a language model")
    model_class: type
    flops_per_token: Callable[[ModelConfig, int], float]
    trainable: Callable | None  # None: every parameter trains; else predicate(key_path) of those that do
    base: BaseCheckpoint | None
    suites: tuple[str, ...]  # the evaluation suites that measure a model of the kind
    export: ExportClass
    context_parallel: bool = False  # runs with the sequence split over mesh.context (its mixers permitting)


def _init_from_directory(value: str) -> str:
    return value[len("hf:"):] if value.startswith("hf:") else value


def _lm_adopt(user: ModelConfig, base: ModelConfig) -> ModelConfig:
    """The base's section, still naming the base (training reads its weights from ``model.init_from``)."""
    return replace(base, init_from=user.init_from)


def _lm_merge(fresh: dict, base: dict) -> dict:
    """Every parameter is the base's."""
    return base


def _ahn_adopt(user: ModelConfig, base: ModelConfig) -> ModelConfig:
    """The base's decoder layers with the user's AHN settings and initialisation of the compressors."""
    return replace(base, kind="ahn", ahn=user.ahn, init_std=user.init_std)


def _ahn_merge(fresh: dict, base: dict) -> dict:
    """The base's weights, and each layer's compressor (``blocks/i/ahn``) as freshly initialised."""
    compressors, _ = split_params(fresh, trainable_path)
    return merge_params(compressors, base)


CAUSAL_LM = ExportClass("SeqmodelsForCausalLM", "AutoModelForCausalLM")
KINDS: dict[str, ModelKind] = {kind.name: kind for kind in (
    ModelKind("lm", "a language model", LM, lm_flops_per_token, None,
              BaseCheckpoint("init_from", _init_from_directory, _lm_adopt, _lm_merge, CONTINUED_PRETRAINING_LR,
                             "continued pretraining: the default of transformers' TrainingArguments"),
              ("perplexity", "recall", "cfl", "ruler"), CAUSAL_LM, context_parallel=True),
    ModelKind("looped", "a looped model", LoopedModel, looped_flops_per_token, None, None, ("cfl",),
              ExportClass("SeqmodelsLoopedForSequenceClassification", "AutoModelForSequenceClassification",
                          labels=("reject", "accept")),  # the head's <reject>, <accept> columns
              context_parallel=True),
    ModelKind("ahn", "an AHN run", AHNModel, ahn_flops_per_token, trainable_path,
              BaseCheckpoint("ahn.base", str, _ahn_adopt, _ahn_merge, AHN_COMPRESSOR_LR,
                             "AHN's compressors over a frozen base: the rate of configs/ahn_*.yaml"),
              ("ahn", "ruler"), CAUSAL_LM, context_parallel=True),
)}


def model_kind(model: ModelConfig) -> ModelKind:
    """The declaration of ``model.kind``; ``ConfigError`` naming the known kinds for another."""
    if model.kind not in KINDS:
        raise ConfigError(f"model.kind: unknown kind {model.kind!r}; known kinds: {', '.join(KINDS)}")
    return KINDS[model.kind]


def check_context_parallel_kind(model: ModelConfig, context: int) -> None:
    """``ConfigError`` when ``context > 1`` and the kind has no context-parallel form."""
    kind = model_kind(model)
    if context > 1 and not kind.context_parallel:
        ready = ", ".join(name for name, other in KINDS.items() if other.context_parallel)
        raise ConfigError(f"mesh.context={context}: {kind.description} (model.kind={kind.name}) cannot yet run with "
                          f"the sequence split over devices (context-parallel kinds: {ready}); use mesh.context=1")


def build_model(config: ModelConfig, *, seed: int = 0):
    """The model ``config.kind`` names, initialised from ``seed``."""
    return model_kind(config).model_class(config, rngs=nnx.Rngs(params=seed))


def abstract_model(config: ModelConfig, seed: int = 0):
    """``(graphdef, abstract nnx.State)`` of the model without allocating its parameters."""
    model = nnx.eval_shape(lambda: build_model(config, seed=seed))
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError("models must hold only nnx.Param variables; found other state: "
                         f"{list(nnx.to_flat_state(rest))[:3]}")
    return graphdef, state


def flops_per_token(model_config: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of the model ``model_config`` describes, at rows of ``seq_len`` tokens."""
    return model_kind(model_config).flops_per_token(model_config, seq_len)


def trainable_filter(model_config: ModelConfig):
    """``None`` when every parameter trains, else ``predicate(key_path) -> bool`` of the parameters that do."""
    return model_kind(model_config).trainable


def kinds_measured_by(suite: str) -> list[ModelKind]:
    """The kinds whose declaration lists the evaluation suite ``suite``."""
    return [kind for kind in KINDS.values() if suite in kind.suites]
