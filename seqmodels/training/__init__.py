"""Train state, train step, loop, checkpoints (written; ``seqmodels.runs`` reads them) and metrics. Knows
models only through their kind (``seqmodels.models``: build, ``loss``, ``flops_per_token``, which parameters
train) and a base's weights only through ``seqmodels.hf.base.start_params``; it names no kind."""
