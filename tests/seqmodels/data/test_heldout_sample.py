"""The held-out sample: seeded random order of held-out documents, every one drawn over a full pass."""

import numpy as np
import pytest

from seqmodels.config import DataConfig
from seqmodels.data import load_documents, make_eval_batches
from seqmodels.data.heldout_sample import sample_order

SEQ_LEN, BATCH = 16, 4


@pytest.fixture
def corpus(tmp_path):
    """40 documents, each a distinct tag repeated: a document is recognisable from any row it fills."""
    for i in range(40):
        (tmp_path / f"doc{i:02d}.txt").write_text(f"<{i:02d}>" * (5 + i % 7))
    return DataConfig(source="text_files", path=str(tmp_path / "*.txt"), seq_len=SEQ_LEN, heldout_fraction=0.5)


def test_a_full_pass_draws_every_heldout_document_once_in_a_seeded_random_order(corpus):
    split = load_documents(corpus)
    batches = make_eval_batches(corpus, batch_size=BATCH, max_batches=1000)
    documents = np.concatenate([b["documents"][b["documents"] >= 0] for b in batches])
    first_seen = list(dict.fromkeys(documents.tolist()))
    assert sorted(first_seen) == list(range(len(split.heldout))) and len(split.heldout) >= 10
    assert first_seen == sample_order(len(split.heldout), corpus.heldout_seed).tolist()
    assert first_seen != sorted(first_seen)


def test_each_token_is_labelled_with_the_document_it_came_from(corpus):
    split = load_documents(corpus)
    for batch in make_eval_batches(corpus, batch_size=BATCH, max_batches=1000):
        for row_targets, row_documents in zip(batch["targets"], batch["documents"]):
            for target, document in zip(row_targets, row_documents):
                if document >= 0 and target < 256:
                    assert chr(target) in split.heldout[int(document)]
        assert np.all((batch["documents"] >= 0) == (batch["loss_mask"] > 0))


def test_a_short_sample_spreads_over_many_documents_and_the_seed_changes_it(corpus):
    # 2 batches x 4 rows: each document at most one row, so at least 8 documents; corpus order would give fewer
    sample = make_eval_batches(corpus, batch_size=BATCH, max_batches=2)
    drawn = {int(d) for b in sample for d in np.unique(b["documents"]) if d >= 0}
    assert len(drawn) >= 2 * BATCH
    other = make_eval_batches(DataConfig(**{**corpus.__dict__, "heldout_seed": 1}), batch_size=BATCH, max_batches=2)
    assert drawn != {int(d) for b in other for d in np.unique(b["documents"]) if d >= 0}


def test_sample_order_refuses_bad_arguments():
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        sample_order(3, -1)
    with pytest.raises(ValueError, match="count must be an int >= 0"):
        sample_order(-2, 0)
