"""A run directory as ``train.py`` writes it, read back: its resolved config and its checkpoints.

    run_dir/config.yaml                                    the resolved config (``seqmodels.config_io``)
    run_dir/checkpoints/<step>/{params, opt_state, meta, data, config}    orbax items, one directory per step

``checkpoints`` reads the steps, each step's saved config and its parameters; ``load`` gives a run's
config and model. Training writes these files (``seqmodels.training.checkpoint``); evaluation, export
and a model that starts from a run (an AHN base) read them here, so none of them imports the loop.
"""
