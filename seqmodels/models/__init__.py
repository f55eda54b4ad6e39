"""Model assemblies. A model is an ``nnx.Module`` offering, besides ``__call__``:

- ``loss(batch) -> (loss_sum, token_count)``: summed loss over the batch's loss tokens and their
  count, so gradient accumulation over micro-batches is exact (the train step divides once);
- ``flops_per_token(seq_len) -> float``: forward FLOPs per token (MFU counts training as 3x);
- ``init_cache(batch_size, max_len)`` for decoding.

Each ``model.kind`` declares itself in ``kinds`` (the class, its FLOPs, which parameters train, the
checkpoint it starts from, its evaluation suites, its export); the names below dispatch through it.
"""

from seqmodels.models.kinds import (KINDS, ModelKind, abstract_model, build_model,  # noqa: F401
                                    check_context_parallel_kind, flops_per_token, kinds_measured_by, model_kind,
                                    trainable_filter)
from seqmodels.models.lm import LM, generate, lm_flops_per_token  # noqa: F401
