import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seqmodels.layers.conv import ShortConv


def direct(conv, x, segments):
    """The definition, term by term."""
    w, b = np.asarray(conv.weight.get_value()), np.asarray(conv.bias.get_value())
    x, segments = np.asarray(x), np.asarray(segments)
    y = np.zeros_like(x) + b
    for t in range(x.shape[1]):
        for j in range(w.shape[0]):
            if t - j >= 0:
                y[:, t] += w[j] * x[:, t - j] * (segments[:, t - j] == segments[:, t])[:, None]
    return y


def test_short_conv_is_causal_depthwise_and_stops_at_document_boundaries():
    conv = ShortConv(6, 4, rngs=nnx.Rngs(0))
    conv.bias.set_value(jnp.arange(6.0))
    x = jax.random.normal(jax.random.key(1), (2, 9, 6))
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 2, 3], [1] * 9])
    y, _ = conv(x, segment_ids=segments)
    np.testing.assert_allclose(y, direct(conv, x, segments), atol=1e-5)


def test_short_conv_step_by_step_with_cache_equals_whole_sequence():
    conv = ShortConv(5, 3, rngs=nnx.Rngs(2))
    x = jax.random.normal(jax.random.key(3), (2, 7, 5))
    full, _ = conv(x)
    cache = conv.init_cache(2, 5)
    head, cache = conv(x[:, :3], cache=cache)  # a prefill of 3 tokens, then single steps
    steps = [head]
    for t in range(3, 7):
        y, cache = conv(x[:, t:t + 1], cache=cache)
        steps.append(y)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-6)


def test_document_starts_reset_the_log_decay_only_where_a_new_segment_begins():
    from seqmodels.layers.segments import RESET_LOG_DECAY, reset_at_document_starts
    segments = jnp.array([[1, 1, 2, 2, 2, 0], [3, 3, 3, 3, 3, 3]])
    log_decay = -0.1 * jnp.ones((2, 6, 4))
    reset = np.asarray(reset_at_document_starts(log_decay, segments))
    assert (reset[0, [2, 5]] == RESET_LOG_DECAY).all() and (reset[0, [0, 1, 3, 4]] == -0.1).all()
    assert (reset[1] == np.float32(-0.1)).all()
    assert reset_at_document_starts(log_decay, None) is log_decay
