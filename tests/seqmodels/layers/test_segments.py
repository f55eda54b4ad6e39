import jax.numpy as jnp
import numpy as np

from seqmodels.layers.segments import RESET_LOG_DECAY, document_starts, reset_at_document_starts


def test_document_starts_marks_each_change_of_segment_after_the_first_token():
    ids = jnp.array([[1, 1, 2, 2, 3], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(document_starts(ids), [[False, False, True, False, True], [False] * 5])


def test_document_starts_keeps_the_shape_of_a_single_token_row():
    starts = document_starts(jnp.array([[7], [3]]))
    assert starts.shape == (2, 1) and not starts.any()


def test_reset_at_document_starts_replaces_the_decay_of_the_first_token_of_each_document():
    log_decay = -jnp.ones((1, 3, 2))
    out = reset_at_document_starts(log_decay, jnp.array([[1, 2, 2]]))
    assert (out[0, 1] == RESET_LOG_DECAY).all() and (out[0, jnp.array([0, 2])] == -1).all()
    assert reset_at_document_starts(log_decay, None) is log_decay
