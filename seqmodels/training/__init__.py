"""Train state, train step, loop, checkpoints and metrics. Knows models only through
``seqmodels.models`` (build, ``loss``, ``flops_per_token``)."""
