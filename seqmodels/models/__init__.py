"""Model assemblies. A model is an ``nnx.Module`` offering, besides ``__call__``:

- ``loss(batch) -> (loss_sum, token_count)``: summed loss over the batch's loss tokens and their
  count, so gradient accumulation over micro-batches is exact (the train step divides once);
- ``flops_per_token(seq_len) -> float``: forward FLOPs per token (MFU counts training as 3x);
- ``init_cache(batch_size, max_len)`` for decoding.
"""

from seqmodels.models.lm import LM, build_model, generate, lm_flops_per_token  # noqa: F401


def flops_per_token(model_config, seq_len: int) -> float:
    """Forward FLOPs per token of the model ``model_config`` describes, at rows of ``seq_len`` tokens."""
    return lm_flops_per_token(model_config, seq_len)
