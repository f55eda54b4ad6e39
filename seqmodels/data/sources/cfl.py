"""Context-free-language recognition: the source ``cfl`` (the task itself is the package ``seqmodels.data.cfl``).

Training rows are as long as each batch's length range needs, so shorter than ``data.seq_len`` for
short strings; evaluation rows are ``data.seq_len`` long (``cfl/batches.py``). Token ids: the fixed
ids of ``seqmodels.special_tokens``, one [BOS] per language, the symbols (``cfl/rows.py``).
"""

from __future__ import annotations

from seqmodels.config import DataConfig
from seqmodels.data.cfl.batches import check_cfl_config, make_cfl_eval_batches, make_cfl_train_dataset
from seqmodels.data.cfl.rows import VOCAB_SIZE
from seqmodels.data.sources import DataSource, register_source


def describe_cfl(cfg: DataConfig) -> str:
    """One line for the training log: the languages, the length range, the seed."""
    return (f"cfl languages {list(cfg.cfl.languages)}, lengths {cfg.cfl.min_length}..{cfg.cfl.max_length}, "
            f"seed {cfg.seed}")


def cfl_vocab_size(cfg: DataConfig) -> int:
    """``VOCAB_SIZE``: the fixed ids, one [BOS] per language, the symbols."""
    return VOCAB_SIZE


register_source("cfl", DataSource(train=make_cfl_train_dataset, eval=make_cfl_eval_batches, vocab_size=cfl_vocab_size,
                                  describe=describe_cfl, check=check_cfl_config))
