"""Model assemblies. A model is an ``nnx.Module`` offering, besides ``__call__``:

- ``loss(batch) -> (loss_sum, token_count)``: summed loss over the batch's loss tokens and their
  count, so gradient accumulation over micro-batches is exact (the train step divides once);
- ``flops_per_token(seq_len) -> float``: forward FLOPs per token (MFU counts training as 3x);
- ``init_cache(batch_size, max_len)`` for decoding.

``MODEL_KINDS`` maps ``model.kind`` to the class, its FLOPs formula and which parameters train
(``None``: all; else a predicate on a parameter's key path: AHN trains only its compressors).
"""

from dataclasses import dataclass
from typing import Callable

from flax import nnx

from seqmodels.models.ahn import AHNModel, ahn_flops_per_token, trainable_path
from seqmodels.models.lm import LM, generate, lm_flops_per_token  # noqa: F401
from seqmodels.models.looped import LoopedModel, looped_flops_per_token


@dataclass(frozen=True)
class ModelKind:
    model_class: type
    flops_per_token: Callable
    trainable: Callable | None = None


MODEL_KINDS = {"lm": ModelKind(LM, lm_flops_per_token),
               "looped": ModelKind(LoopedModel, looped_flops_per_token),
               "ahn": ModelKind(AHNModel, ahn_flops_per_token, trainable_path)}


def build_model(config, *, seed: int = 0):
    """The model ``config.kind`` names (``MODEL_KINDS``), initialised from ``seed``."""
    return MODEL_KINDS[config.kind].model_class(config, rngs=nnx.Rngs(params=seed))


def flops_per_token(model_config, seq_len: int) -> float:
    """Forward FLOPs per token of the model ``model_config`` describes, at rows of ``seq_len`` tokens."""
    return MODEL_KINDS[model_config.kind].flops_per_token(model_config, seq_len)


def trainable_filter(model_config):
    """``None`` when every parameter trains, else ``predicate(key_path) -> bool`` of the parameters that do."""
    return MODEL_KINDS[model_config.kind].trainable
