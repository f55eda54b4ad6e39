"""Model assemblies. A model is an ``nnx.Module`` offering, besides ``__call__``:

- ``loss(batch) -> (loss_sum, token_count)``: summed loss over the batch's loss tokens and their
  count, so gradient accumulation over micro-batches is exact (the train step divides once);
- ``flops_per_token(seq_len) -> float``: forward FLOPs per token (MFU counts training as 3x);
- ``init_cache(batch_size, max_len)`` for decoding.
"""

from flax import nnx

from seqmodels.models.lm import LM, generate, lm_flops_per_token  # noqa: F401
from seqmodels.models.looped import LoopedModel, looped_flops_per_token


def build_model(config, *, seed: int = 0):
    """The model ``config.kind`` names (``lm``: ``LM``; ``looped``: ``LoopedModel``), initialised from ``seed``."""
    model_class = LoopedModel if config.kind == "looped" else LM
    return model_class(config, rngs=nnx.Rngs(params=seed))


def flops_per_token(model_config, seq_len: int) -> float:
    """Forward FLOPs per token of the model ``model_config`` describes, at rows of ``seq_len`` tokens."""
    if model_config.kind == "looped":
        return looped_flops_per_token(model_config, seq_len)
    return lm_flops_per_token(model_config, seq_len)
