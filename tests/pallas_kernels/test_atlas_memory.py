"""pallas_kernels.atlas_memory, the Atlas recurrence: chunk-parallel form == sequential reference (values and gradients), the
online rule at chunk size 1, document isolation, zero momentum without NaN, and the memory's LayerNorm (memory_norm)."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import newton_schulz
from pallas_kernels.atlas_memory import (AtlasInputs, AtlasSettings, MemoryLayout, atlas_memory, atlas_memory_step,
                                         init_state, memory_apply, memory_loss)
from pallas_kernels.atlas_memory import xla as atlas_xla
from pallas_kernels.atlas_memory.reference import settled_memory
from pallas_kernels.atlas_memory.memory import gradient_factors, orthogonalize
from pallas_kernels.newton_schulz.coefficients import resolve_coefficients
from seqmodels.mixers.atlas import feature_dim, feature_map, initial_coefficients

pytestmark = pytest.mark.xdist_group("atlas_memory")  # one worker: jitted programs are reused

# The two forms compared: the chunk-parallel form (impl "xla", its linear scans and Newton-Schulz
# calls by their xla forms too) and the token-by-token oracle.
chunked = functools.partial(atlas_memory)
reference = functools.partial(atlas_memory, impl="reference")

BATCH, LENGTH, HEADS, KEY_DIM, REDUCED = 2, 10, 2, 4, 3
# Row 0 packs three documents (the second starts mid-chunk) and ends in padding; row 1 is one document.
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 2, 2, 3, 0], [1] * LENGTH], np.int32)
GATE_RANGES = {"alpha": (0.8, 1.0), "theta": (0.0, 0.9), "eta": (0.0, 0.3), "gamma": (0.0, 1.0)}


def make_case(deep: bool, degree: int, seed: int = 0, norm: bool = False):
    """Random unit keys/queries, values, gates within their ranges, a random initial memory and, with
    ``norm``, a LayerNorm gain of ``1 + 0.3 N(0, 1)`` per head and channel."""
    keys = jax.random.split(jax.random.key(seed), 12)
    layout = MemoryLayout(feature_dim(KEY_DIM, degree, REDUCED), KEY_DIM, 2 * KEY_DIM if deep else 0, norm=norm)
    coefficients = None if degree == 1 else jnp.broadcast_to(initial_coefficients(degree), (HEADS, degree))

    def unit_features(key):
        x = jax.random.normal(key, (BATCH, LENGTH, HEADS, KEY_DIM))
        return feature_map(x / jnp.linalg.norm(x, axis=-1, keepdims=True), coefficients, REDUCED)

    gates = [low + (high - low) * jax.random.uniform(keys[3 + i], (BATCH, LENGTH, HEADS))
             for i, (low, high) in enumerate(GATE_RANGES.values())]
    gain = 1.0 + 0.3 * jax.random.normal(keys[7], (HEADS, KEY_DIM)) if norm else None
    inputs = AtlasInputs(unit_features(keys[0]), jax.random.normal(keys[1], (BATCH, LENGTH, HEADS, KEY_DIM)),
                         unit_features(keys[2]), *gates, jnp.asarray(SEGMENTS), gain)
    initial = tuple(0.3 * jax.random.normal(keys[8 + i], (HEADS, m, n)) for i, (m, n) in enumerate(layout.shapes))
    return inputs, initial, layout


@functools.cache
def value_and_grads(form, settings: AtlasSettings):
    """jit of ``(sum(y * w), grads wrt every float input, the norm gain and M_0)`` for ``form`` in {chunked, reference}."""
    def objective(floats, initial, segment_ids, weights):
        y = form(AtlasInputs(*floats[:7], segment_ids, *floats[7:]), initial, settings)
        return jnp.sum(y * weights), y
    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))


def evaluate(form, inputs, initial, settings):
    weights = jax.random.normal(jax.random.key(7), inputs.values.shape)
    floats = tuple(inputs[:7]) + (() if inputs.norm_gain is None else (inputs.norm_gain,))
    (_, y), grads = value_and_grads(form, settings)(floats, initial, inputs.segment_ids, weights)
    return y, grads


CASES = {
    # deep MLP memory, degree-2 features, window 3 across chunks of 4, Muon NS (k = 5), ragged length 10
    "deep-p2-c3-b4-k5": (True, 2, AtlasSettings(None, window=3, chunk_size=4, ns_steps=5)),
    # the same with the memory's LayerNorm and gain (memory_norm), eta on the update (the paper's Eq. 32)
    "deep-p2-c3-b4-k5-norm": (True, 2, AtlasSettings(None, window=3, chunk_size=4, ns_steps=5, eta_scales="update")),
    # linear memory with LayerNorm, gain and residual (TTT-Linear's form), window 6 > chunk 4, clipped, no NS
    "linear-p1-c6-b4-k0-norm": (False, 1, AtlasSettings(None, window=6, chunk_size=4, ns_steps=0, grad_clip=0.5)),
    # linear memory, identity features, window 6 > chunk 4 (reaches two chunks back), no NS (OmegaNet rule)
    "linear-p1-c6-b4-k0": (False, 1, AtlasSettings(None, window=6, chunk_size=4, ns_steps=0)),
    # linear memory, degree-2 features, Muon NS with eta on the orthogonalised update (Muon's learning rate)
    "linear-p2-c2-b4-k5-update": (False, 2, AtlasSettings(None, window=2, chunk_size=4, ns_steps=5,
                                                          eta_scales="update")),
    # deep memory, Polar Express NS, a window of 5 over chunks of 2 (it reaches back three chunks), eta on the update
    "deep-p2-c5-b2-k5-polar": (True, 2, AtlasSettings(None, window=5, chunk_size=2, ns_steps=5,
                                                      ns_coefficients="polar_express", eta_scales="update")),
    # Titans (c = 1, p = 1, k = 0) with deep memory and the inner gradient clipped at a norm that most tokens exceed
    "deep-p1-c1-b4-k0-clip": (True, 1, AtlasSettings(None, window=1, chunk_size=4, ns_steps=0,
                                                     grad_clip=0.5)),
}


def settings_for(name):
    deep, degree, settings = CASES[name]
    inputs, initial, layout = make_case(deep, degree, norm=name.endswith("-norm"))
    return inputs, initial, dataclasses.replace(settings, layout=layout)


def scale_tolerance(settings):
    # float32. Without NS the two forms differ by summation order only (~1e-6 relative). Each NS step
    # multiplies small singular values by up to its a_t, so k steps amplify rounding by up to prod a_t
    # (muon: 3.4445^5 ~ 485; polar_express: ~980): ~1e-7 times that, with a margin of 20 (muon: ~1e-3).
    if not settings.ns_steps:
        return 2e-5
    schedule, _ = resolve_coefficients(settings.ns_coefficients, settings.ns_steps)
    return 20 * 1e-7 * math.prod(a for a, _, _ in schedule)


# The memory-norm cases take 40-70 s each on a loaded 2-core CPU (the reference scan's autodiff).
SLOW_CASES = {"deep-p2-c3-b4-k5-norm", "linear-p1-c6-b4-k0-norm"}


# linear-p1-c6-b4-k0 (the other tests' fast case) is left out: its window of 6 over chunks of 4 without NS is
# linear-p1-c6-b4-k0-norm's (which adds the norm and the clip), its plain linear memory linear-p2-c2-b4-k5-update's.
@pytest.mark.parametrize("case", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CASES else name
                                  for name in sorted(CASES) if name != "linear-p1-c6-b4-k0"])
def test_chunked_form_matches_sequential_reference_values_and_gradients(case):
    inputs, initial, settings = settings_for(case)
    y_chunked, grads_chunked = evaluate(chunked, inputs, initial, settings)
    y_reference, grads_reference = evaluate(reference, inputs, initial, settings)
    tolerance = scale_tolerance(settings)
    assert np.abs(np.asarray(y_reference)).max() > 0.1  # the memory produced real outputs
    np.testing.assert_allclose(y_chunked, y_reference, atol=tolerance * np.abs(y_reference).max(), rtol=0)
    for got, want in zip(jax.tree.leaves(grads_chunked), jax.tree.leaves(grads_reference)):
        scale = max(float(np.abs(want).max()), 1e-6)
        np.testing.assert_allclose(got, want, atol=tolerance * scale, rtol=0)
    assert float(np.abs(grads_reference[1][0]).max()) > 0  # gradients reach the initial memory


def online_rule(inputs, initial, layout, window, ns_steps, reevaluate=True, eta_on_update=False):
    """The fully online Omega rule written out: every window term at M_{t-1}, per token, per document.

    ``reevaluate=False`` is the earlier rule: each token's gradient taken once, at its own M_{t-1},
    and reused by the next c - 1 tokens. ``eta_on_update``: ``M_t = alpha M + eta NS(S_t)``, ``S_t = theta S - G``.
    """
    gain = inputs.norm_gain
    starts = np.concatenate([[True], SEGMENTS[0, 1:] != SEGMENTS[0, :-1]])
    outputs = []
    for row in range(BATCH):
        memory, momentum, history, row_out = initial, None, [], []
        for t in range(LENGTH):
            token = [x[row, t] for x in inputs[:7]]  # [H, ...] each
            if t == 0 or (row == 0 and starts[t]):
                memory, momentum, history = initial, tuple(jnp.zeros_like(w) for w in initial), []
            weight = token[6] * float(SEGMENTS[row, t] != 0) if row == 0 else token[6]
            if reevaluate:
                history = (history + [(token[0], token[1], weight)])[-window:]
                terms = [tuple(w[:, None, None] * g for g in jax.grad(memory_loss)(memory, k, v, layout, gain))
                         for k, v, w in history]
            else:
                grads = jax.grad(memory_loss)(memory, token[0], token[1], layout, gain)
                history = (history + [tuple(weight[:, None, None] * g for g in grads)])[-window:]
                terms = history
            total = tuple(sum(parts) for parts in zip(*terms))
            eta = token[5][:, None, None]
            momentum = tuple(token[4][:, None, None] * s - (1.0 if eta_on_update else eta) * g
                             for s, g in zip(momentum, total))
            update = momentum if ns_steps == 0 else tuple(newton_schulz(s, steps=ns_steps, impl="reference")
                                                            for s in momentum)
            memory = tuple(token[3][:, None, None] * m + (eta if eta_on_update else 1.0) * u
                           for m, u in zip(memory, update))
            row_out.append(memory_apply(memory, token[2], layout, gain))
        outputs.append(jnp.stack(row_out))
    return jnp.stack(outputs)


def test_chunk_size_one_is_the_fully_online_rule():
    inputs, initial, settings = settings_for("deep-p2-c3-b4-k5")
    online = AtlasSettings(settings.layout, window=3, chunk_size=1, ns_steps=5)
    expected = online_rule(inputs, initial, settings.layout, window=3, ns_steps=5)
    tolerance = scale_tolerance(online) * float(jnp.abs(expected).max())
    np.testing.assert_allclose(jax.jit(chunked, static_argnums=2)(inputs, initial, online), expected, atol=tolerance)
    np.testing.assert_allclose(jax.jit(reference, static_argnums=2)(inputs, initial, online), expected,
                               atol=tolerance)
    # With chunks of 4 the gradients are taken at chunk starts instead: a different rule.
    y_chunks, _ = evaluate(chunked, inputs, initial, settings)
    assert float(jnp.abs(y_chunks - expected).max()) > 100 * tolerance
    # Reusing each token's own gradient across the window (the earlier rule) is a different rule too.
    reused = online_rule(inputs, initial, settings.layout, window=3, ns_steps=5, reevaluate=False)
    assert float(jnp.abs(reused - expected).max()) > 100 * tolerance


def test_packed_documents_share_no_state():
    inputs, initial, settings = settings_for("deep-p2-c3-b4-k5")
    # Document A fills the first chunk (4 tokens), document B the next 6 tokens.
    packed_segments = jnp.asarray([[1] * 4 + [2] * 6] * BATCH, jnp.int32)
    alone = AtlasInputs(*(jnp.concatenate([x[:, 4:], x[:, :4]], axis=1) for x in inputs[:7]),
                        jnp.asarray([[1] * 6 + [0] * 4] * BATCH, jnp.int32))  # B, then padding
    y_packed, _ = evaluate(chunked, inputs._replace(segment_ids=packed_segments), initial, settings)
    y_alone, _ = evaluate(chunked, alone, initial, settings)
    np.testing.assert_allclose(y_packed[:, 4:], y_alone[:, :6], atol=1e-5, rtol=0)  # float32, same arithmetic
    y_joined, _ = evaluate(chunked, inputs._replace(segment_ids=jnp.ones_like(packed_segments)), initial, settings)
    assert float(jnp.abs(y_joined[:, 4:] - y_alone[:, :6]).max()) > 1e-3  # without segments, A leaks into B


@pytest.mark.slow  # ~11 s
def test_zero_momentum_gives_no_nan_and_keeps_the_initial_memory():
    inputs, initial, settings = settings_for("deep-p2-c3-b4-k5")
    # eta = 0 and gamma = 0: every momentum is exactly zero, so NS_5 runs on zero matrices.
    zero = inputs._replace(eta=jnp.zeros_like(inputs.eta), gamma=jnp.zeros_like(inputs.gamma),
                           alpha=jnp.ones_like(inputs.alpha))
    y, grads = evaluate(chunked, zero, initial, settings)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    # The memory never moves from M_0 (alpha = 1): y_t = M_0(phi(q_t)) on every token, padding included.
    np.testing.assert_allclose(y, memory_apply(initial, zero.phi_q, settings.layout), atol=1e-6, rtol=0)


def test_a_zero_gradient_under_the_clip_gives_no_nan():
    # M_0 = 0 and v = 0: every inner gradient is exactly zero, where ||g|| has no derivative.
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    zero = inputs._replace(values=jnp.zeros_like(inputs.values))
    clipped = dataclasses.replace(settings, grad_clip=0.5)
    y, grads = evaluate(chunked, zero, tuple(jnp.zeros_like(w) for w in initial), clipped)
    assert float(jnp.abs(y).max()) == 0.0
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_inputs_of_the_wrong_shape_are_named():
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    message = r"eta must have shape \(2, 10, 2\) \(from phi_k \[B, T, H, F\]\), got \(2, 9, 2\)"
    with pytest.raises(ValueError, match=message):
        chunked(inputs._replace(eta=inputs.eta[:, :9]), initial, settings)
    with pytest.raises(ValueError, match=r"initial_memory\[0\] must have shape \[H, m, n\] = \(2, 4, 4\)"):
        reference(inputs, (initial[0][:1],), settings)
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        AtlasSettings(settings.layout, window=0, chunk_size=4, ns_steps=0)
    with pytest.raises(ValueError, match=r"grad_clip must be >= 0 \(0 = no clipping\), got -1.0"):
        AtlasSettings(settings.layout, window=1, chunk_size=4, ns_steps=0, grad_clip=-1.0)
    with pytest.raises(ValueError, match="eta_scales must be 'gradient' or 'update', got 'memory'"):
        AtlasSettings(settings.layout, window=1, chunk_size=4, ns_steps=0, eta_scales="memory")


@pytest.mark.slow  # ~11 s
def test_eta_on_the_update_scales_the_memory_step():
    # A different rule from eta on the gradient (else its equivalence case proves nothing). At a
    # document's first token (memory M_0, momentum 0) the step is eta_t NS_k(-G_t) with eta on the
    # update: halving eta halves the read-out's departure from M_0. With eta on the gradient the
    # scale-free NS_k gives the same step whatever eta.
    inputs, initial, settings = settings_for("linear-p2-c2-b4-k5-update")
    inputs = inputs._replace(alpha=jnp.ones_like(inputs.alpha))  # M_1 = M_0 + step: y_0 - M_0(phi(q_0)) is the step
    halved = inputs._replace(eta=inputs.eta / 2)
    first = memory_apply(initial, inputs.phi_q[:, 0], settings.layout)

    def first_step(rule, token_inputs):
        y, _ = evaluate(chunked, token_inputs, initial, dataclasses.replace(settings, eta_scales=rule))
        return y[:, 0] - first

    y, _ = evaluate(chunked, inputs, initial, settings)
    y_gradient, _ = evaluate(chunked, inputs, initial, dataclasses.replace(settings, eta_scales="gradient"))
    assert float(jnp.abs(y - y_gradient).max()) > 0.05 * float(jnp.abs(y).max())
    step = first_step("update", inputs)
    assert float(jnp.abs(step).max()) > 1e-2
    np.testing.assert_allclose(first_step("update", halved), step / 2, atol=1e-3 * float(jnp.abs(step).max()))
    np.testing.assert_allclose(first_step("gradient", halved), first_step("gradient", inputs),
                               atol=1e-3 * float(jnp.abs(step).max()))


@pytest.mark.slow  # ~9 s
def test_gradient_clip_is_active_in_the_clipped_case():
    # The clipped case must differ from the same rule unclipped, or its equivalence test proves nothing.
    inputs, initial, settings = settings_for("deep-p1-c1-b4-k0-clip")
    y_clipped, _ = evaluate(chunked, inputs, initial, settings)
    y_plain, _ = evaluate(chunked, inputs, initial, dataclasses.replace(settings, grad_clip=0.0))
    assert float(jnp.abs(y_clipped - y_plain).max()) > 0.05 * float(jnp.abs(y_plain).max())


def test_gradient_clip_bounds_the_memory_where_the_chunked_step_overshoots():
    # 256 tokens of one repeated unit key, eta = 0.5, no decay: with chunks of 16 every chunk applies
    # 16 gradients taken at its start, a step of 2 eta * 16 = 16x the one that zeroes the error, so the
    # error is multiplied by -15 per chunk and the read-out explodes. Clipping every token's gradient
    # at tau bounds each memory increment by eta tau: ||M_t||_F <= t eta tau (M_0 = 0, unit query).
    length, tau, eta = 256, 1.0, 0.5
    layout = MemoryLayout(KEY_DIM, KEY_DIM)
    key = jnp.full((1, length, 1, KEY_DIM), KEY_DIM ** -0.5)
    values = jax.random.normal(jax.random.key(3), (1, length, 1, KEY_DIM))
    ones = jnp.ones((1, length, 1))
    inputs = AtlasInputs(key, values, key, ones, 0 * ones, eta * ones, ones, jnp.ones((1, length), jnp.int32))
    initial = (jnp.zeros((1, KEY_DIM, KEY_DIM)),)
    plain = AtlasSettings(layout, window=1, chunk_size=16, ns_steps=0)
    y_plain = chunked(inputs, initial, plain)
    assert not bool(jnp.all(jnp.abs(y_plain) < 1e6))  # overflowed or astronomically large
    y = chunked(inputs, initial, dataclasses.replace(plain, grad_clip=tau))
    norms = jnp.linalg.norm(y[0, :, 0], axis=-1)
    assert bool(jnp.all(norms <= eta * tau * jnp.arange(1, length + 1) + 1e-4))
    np.testing.assert_allclose(y, reference(inputs, initial, dataclasses.replace(plain, grad_clip=tau)),
                               atol=1e-4 * float(jnp.abs(y).max()), rtol=0)


def test_linear_memory_retrieves_a_value_written_with_a_full_delta_step():
    # Orthonormal keys, eta = 1/2 (a full delta-rule step on ||M k - v||^2), no decay, no momentum: every
    # write stores its value exactly and later writes on orthogonal keys leave it alone, also when the
    # gradients of a chunk are all taken at the chunk start.
    layout = MemoryLayout(KEY_DIM, KEY_DIM)
    keys = jnp.broadcast_to(jnp.eye(KEY_DIM)[jnp.arange(LENGTH) % KEY_DIM][None, :, None], (1, LENGTH, 1, KEY_DIM))
    values = jax.random.normal(jax.random.key(0), (1, LENGTH, 1, KEY_DIM))
    ones = jnp.ones((1, LENGTH, 1))
    inputs = AtlasInputs(keys, values, jnp.broadcast_to(keys[:, :1], keys.shape), ones, 0 * ones, ones / 2, ones,
                         jnp.ones((1, LENGTH), jnp.int32))
    initial = (jnp.zeros((1, KEY_DIM, KEY_DIM)),)
    for chunk_size in (1, 4):
        settings = AtlasSettings(layout, window=1, chunk_size=chunk_size, ns_steps=0)
        y = chunked(inputs, initial, settings)
        # The query is the first key: its value comes back until the fifth token rewrites that key.
        np.testing.assert_allclose(y[0, :KEY_DIM, 0], jnp.broadcast_to(values[0, 0, 0], (KEY_DIM, KEY_DIM)),
                                   atol=1e-5)


def test_impl_and_partition_spec_are_checked_before_tracing():
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    with pytest.raises(ValueError, match="impl must be one of"):
        atlas_memory(inputs, initial, settings, impl="triton")
    with pytest.raises(ValueError, match="must not shard the time axis"):
        atlas_memory(inputs, initial, settings, partition_spec=jax.sharding.PartitionSpec(None, "data"))
    with pytest.raises(ValueError, match="settings must be an AtlasSettings"):
        atlas_memory(inputs, initial, {"window": 1})


def test_decoding_steps_from_the_initial_state_equal_the_reference_on_one_document():
    inputs, initial, settings = settings_for("deep-p2-c3-b4-k5")
    one_document = inputs._replace(segment_ids=jnp.ones_like(inputs.segment_ids))
    state = init_state(BATCH, initial, settings)
    half = LENGTH // 2
    first, second = (jax.tree.map(lambda x, part=part: x[:, part], one_document)
                     for part in (slice(0, half), slice(half, None)))
    state, y_first = atlas_memory_step(state, first, initial, settings, impl="xla")
    state, y_second = atlas_memory_step(state, second, initial, settings, impl="xla")
    expected = reference(one_document, initial, settings)
    tolerance = scale_tolerance(settings)  # Newton-Schulz by its xla form against its reference
    np.testing.assert_allclose(jnp.concatenate([y_first, y_second], axis=1), expected, atol=tolerance, rtol=tolerance)
    assert int(state["position"]) == LENGTH


@pytest.mark.slow
def test_chunk_size_one_with_memory_norm_is_the_fully_online_rule():
    inputs, initial, settings = settings_for("deep-p2-c3-b4-k5-norm")
    online = dataclasses.replace(settings, chunk_size=1)
    expected = online_rule(inputs, initial, settings.layout, window=3, ns_steps=5, eta_on_update=True)
    tolerance = scale_tolerance(online) * float(jnp.abs(expected).max())
    np.testing.assert_allclose(jax.jit(chunked, static_argnums=2)(inputs, initial, online), expected, atol=tolerance)
    np.testing.assert_allclose(jax.jit(reference, static_argnums=2)(inputs, initial, online), expected,
                               atol=tolerance)
    # The norm changes the rule (else the equivalences above prove nothing about it).
    plain_layout = dataclasses.replace(settings.layout, norm=False)
    plain = online_rule(inputs._replace(norm_gain=None), initial, plain_layout, window=3, ns_steps=5,
                        eta_on_update=True)
    assert float(jnp.abs(plain - expected).max()) > 100 * tolerance


@pytest.mark.parametrize("deep", [False, True])
def test_memory_norm_is_layer_norm_of_the_branch_with_gain_plus_residual_and_its_closed_form_gradient(deep):
    inputs, initial, layout = make_case(deep, 2, norm=True)
    phi, values, gain = inputs.phi_k, inputs.values, inputs.norm_gain  # [B, T, H, F], [B, T, H, V], [H, V]
    weights = tuple(np.asarray(w) for w in initial)  # [H, m, n]
    phi_np = np.asarray(phi, np.float64)
    if deep:
        pre = np.einsum("bthf,hfe->bthe", phi_np, weights[0])
        branch = np.einsum("bthe,hev->bthv", pre / (1 + np.exp(-pre)), weights[1])
    else:
        branch = np.einsum("bthf,hfv->bthv", phi_np, weights[0])
    centred = branch - branch.mean(-1, keepdims=True)
    expected = phi_np[..., :KEY_DIM] + np.asarray(gain) * centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(memory_apply(initial, phi, layout, gain), expected, rtol=1e-5, atol=1e-5)
    # Closed-form rank-1 gradients (what the chunk form uses) == autodiff of the loss, per token.
    one = tuple(jnp.broadcast_to(w, (*phi.shape[:2], *w.shape)) for w in initial)
    autodiff = jax.grad(memory_loss)(one, phi, values, layout, gain)
    closed = tuple(jnp.einsum("...m,...n->...mn", left, right)
                   for left, right in gradient_factors(one, phi, values, layout, gain))
    for got, want in zip(closed, autodiff):
        np.testing.assert_allclose(got, want, atol=1e-5 * float(jnp.abs(want).max()), rtol=0)
    with pytest.raises(ValueError, match="a memory with norm=True needs its gain"):
        memory_apply(initial, phi, layout)


def test_memory_norm_gain_is_checked_against_the_layout():
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0-norm")
    with pytest.raises(ValueError, match=r"norm_gain must have shape \[H, V\] = \(2, 4\), got \(4,\)"):
        chunked(inputs._replace(norm_gain=inputs.norm_gain[0]), initial, settings)
    with pytest.raises(ValueError, match="norm_gain must be an \\[H, V\\] array when the memory layout has norm=True"):
        chunked(inputs._replace(norm_gain=None), initial, settings)
    plain = dataclasses.replace(settings, layout=dataclasses.replace(settings.layout, norm=False))
    with pytest.raises(ValueError, match="layout norm=False, norm_gain \\(2, 4\\)"):
        chunked(inputs, initial, plain)


def test_return_memory_gives_the_memory_after_the_last_token_in_both_forms():
    inputs, initial, settings = settings_for("deep-p2-c3-b4-k5-norm")
    one_document = inputs._replace(segment_ids=jnp.ones_like(inputs.segment_ids))
    y, memory = chunked(one_document, initial, settings, return_memory=True)
    y_reference, memory_reference = reference(one_document, initial, settings, return_memory=True)
    tolerance = scale_tolerance(settings)
    np.testing.assert_allclose(y, y_reference, atol=tolerance * float(jnp.abs(y_reference).max()))
    for got, want, w0 in zip(memory, memory_reference, initial):
        assert got.shape == (BATCH, *w0.shape)
        np.testing.assert_allclose(got, want, atol=tolerance * float(jnp.abs(want).max()))
    # The read-out of the last token is the returned memory applied to its query.
    last = memory_apply(memory, one_document.phi_q[:, -1], settings.layout, one_document.norm_gain)
    np.testing.assert_allclose(last, y[:, -1], atol=1e-5 * float(jnp.abs(y).max()))


@pytest.mark.parametrize("coefficients", ["muon", "polar_express"])
def test_each_matrix_orthogonalised_at_its_shape_equals_the_padded_stacked_call(coefficients):
    """W1 [F, E] and W2 [E, V] each through Newton-Schulz equal one call over W1 stacked with W2^T zero-padded
    to [F, E] (the padded rows stay zero, the norm is unchanged), values and gradients."""
    layout = MemoryLayout(12, 4, 8)  # F = 12, V = 4, E = 8
    keys = jax.random.split(jax.random.key(4), 3)
    momenta = tuple(jax.random.normal(k, (3, 2, m, n)) for k, (m, n) in zip(keys, layout.shapes))
    weights = jax.random.normal(keys[2], (3, 2, 12, 8))

    def padded(momenta):
        w1, w2 = momenta
        w2t = jnp.pad(jnp.swapaxes(w2, -1, -2), [(0, 0), (0, 0), (0, 12 - 4), (0, 0)])
        out = newton_schulz(jnp.stack([w1, w2t], axis=-3), coefficients=coefficients, impl="xla")
        return out[..., 0, :, :], jnp.swapaxes(out[..., 1, :4, :], -1, -2)

    def unpadded(momenta):
        return orthogonalize(momenta, layout, steps=5, coefficients=coefficients, impl="xla")

    def loss(form, momenta):
        w1, w2 = form(momenta)
        return jnp.sum(w1 * weights) + jnp.sum(jnp.sin(w2) * weights[..., :8, :4])

    for got, want in zip(unpadded(momenta), padded(momenta)):
        assert got.shape == want.shape
        # float32: the same iteration on the same nonzero block (the zero rows add exact zeros).
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    grads = [jax.grad(functools.partial(loss, form))(momenta) for form in (unpadded, padded)]
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, atol=1e-4 * float(jnp.abs(want).max()), rtol=0)


# c = 1: no sum (G_t = g_t); c = 3 < b = 4: the window lies inside the chunk and its carried tokens; c = 6 > b:
# the window reaches past the chunk's start into tokens of two chunks back, whose leaving terms cross the chunk's
# start (2 and 9 repeated the paths of 3 and 6).
@pytest.mark.parametrize("window", [1, 3, 6])
def test_running_window_sum_equals_the_banded_sum(window):
    """The recursive window sum (entering term added, leaving term subtracted, reset at a document start)
    equals sum_i [t - c < i <= t, same document] left_i (x) right_i over a span of c - 1 + b tokens."""
    size, heads = 4, 2
    span = size + window - 1
    normal = np.random.default_rng(window).standard_normal  # NumPy draws: making the inputs compiles nothing
    lefts = tuple(normal((BATCH, span, heads, n), np.float32) for n in (3, 5))
    rights = tuple(normal((BATCH, span, heads, n), np.float32) for n in (2, 4))
    # Row 0: the span's last tokens of documents 1, 2 and 3 (three each): the chunk (the last 4) holds document 2's
    # last token and document 3, the carried tokens before it are of documents 1 and 2 (c = 6) or of 2 (c = 3).
    document = np.stack([np.array([1, 1, 1, 2, 2, 2, 3, 3, 3])[-span:], np.full(span, 7)]).astype(np.int32)
    # One program (not one per eager op); the banded sum in NumPy.
    got = jax.jit(atlas_xla._window_sums, static_argnums=(3, 4, 5))(lefts, rights, document, window, "xla", None)
    token = np.arange(size)[:, None] + window - 1  # the chunk's tokens in span positions
    extended = np.arange(span)[None, :]
    band = (extended <= token) & (extended > token - window)
    mask = (band[None] & (document[:, None, :] == document[:, window - 1:, None])).astype(np.float32)
    want = np.concatenate([np.einsum("bti,bihm,bihn->bthmn", mask, np.asarray(left), np.asarray(right))
                           .reshape(BATCH, size, heads, -1) for left, right in zip(lefts, rights)], axis=-1)
    assert got.shape == want.shape == (BATCH, size, heads, 3 * 2 + 5 * 4)
    # float32: at most 2 (c + 1) terms of size ~10 added and subtracted per entry: ~1e-6 absolute.
    np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()), rtol=0)


# One case: the deep memory's case (deep-p2-c3-b4-k5, 30 s on a loaded 2-core CPU) took the same path, each
# weight matrix's Newton-Schulz with ns_dtype (orthogonalize; per matrix: test_each_matrix_orthogonalised_...).
@pytest.mark.parametrize("case", ["linear-p2-c2-b4-k5-update"])
def test_bf16_newton_schulz_matches_the_reference_in_bf16(case):
    """With ns_dtype = bfloat16 the chunked form (bf16 Newton-Schulz matmuls forward and backward, fp32
    accumulation) follows the token-by-token oracle run with the same ns_dtype (bf16-rounded momenta, an fp32
    iteration), and it is a bf16 computation (it differs from float32 by far more than fp32 rounding)."""
    inputs, initial, settings = settings_for(case)
    # The paper's rule (eta on the update, muon): with eta on the gradient every token writes a unit-scale
    # NS step whatever its error, and at these shapes bf16 rounding then sends the float32 and bf16 oracles
    # 40% apart; the Polar Express schedule amplifies bf16 rounding about twice as much as muon's.
    settings = dataclasses.replace(settings, eta_scales="update")
    half = dataclasses.replace(settings, ns_dtype="bfloat16")
    y_chunked, grads_chunked = evaluate(chunked, inputs, initial, half)
    y_reference, grads_reference = evaluate(reference, inputs, initial, half)
    y_fp32, grads_fp32 = evaluate(reference, inputs, initial, settings)
    # bf16 operands (2^-9 relative) through 5 NS steps that amplify small singular values up to ~500x: each
    # token's update differs by a few % (test_newton_schulz), and these compound along the row. Measured
    # (Frobenius): outputs 0.7-2.3% from the bf16 oracle, 1.7-7.5% from float32 (the oracle's own bf16: 1.8-6.6%).
    assert _relative_error(y_chunked, y_reference) < 5e-2
    assert _relative_error(y_chunked, y_fp32) > 1e-3
    # Gradients go through that compounding twice (the trajectory, then the backward): measured 1-83% from the
    # bf16 oracle (the gates' worst), where the bf16 oracle is itself 3-73% from its float32 gradients. The
    # chunked bf16 gradient is within 1.5x the oracle's own bf16 error, or 0.5 (which bounds a sign or scale error).
    for got, want, exact in zip(*(jax.tree.leaves(g) for g in (grads_chunked, grads_reference, grads_fp32))):
        bound = max(0.5, 1.5 * _relative_error(want, exact))
        assert _relative_error(got, want) < bound, (got.shape, _relative_error(got, want), bound)


def _relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-12)


# ns_granularity = "chunk": one Newton-Schulz per chunk, the reads through the linearised memory.
CHUNK_CASES = {
    # deep memory, window 3 across chunks of 4 (ragged: the last chunk holds 2 tokens), eta on the update
    "deep-c3-b4-k5-update": (True, 2, AtlasSettings(None, window=3, chunk_size=4, ns_steps=5, eta_scales="update",
                                                    ns_granularity="chunk")),
    # linear memory, window 6 > chunk 4, eta on the gradient (the settled scale counts the chunk's tokens)
    "linear-c6-b4-k5-gradient": (False, 2, AtlasSettings(None, window=6, chunk_size=4, ns_steps=5,
                                                         ns_granularity="chunk")),
    # deep memory, Polar Express, window 2 over chunks of 3 (the last chunk holds 1 token), clipped
    "deep-c2-b3-k5-polar-clip": (True, 1, AtlasSettings(None, window=2, chunk_size=3, ns_steps=5,
                                                        ns_coefficients="polar_express", eta_scales="update",
                                                        grad_clip=0.5, ns_granularity="chunk")),
    # deep memory with the LayerNorm, gain and residual (memory_norm), window 3 over chunks of 4
    "deep-c3-b4-k5-norm": (True, 2, AtlasSettings(None, window=3, chunk_size=4, ns_steps=5, eta_scales="update",
                                                  ns_granularity="chunk")),
    # linear memory, one chunk of 16 over the whole ragged row (every document starts inside it)
    "linear-c2-b16-k5-update": (False, 1, AtlasSettings(None, window=2, chunk_size=16, ns_steps=5,
                                                        eta_scales="update", ns_granularity="chunk")),
}


def chunk_settings_for(name):
    deep, degree, settings = CHUNK_CASES[name]
    inputs, initial, layout = make_case(deep, degree, seed=1, norm=name.endswith("-norm"))
    return inputs, initial, dataclasses.replace(settings, layout=layout)


@functools.cache
def value_and_grads_with_memory(impl, settings: AtlasSettings):
    """jit of the outputs, the final memory and the gradients of ``sum(y w) + sum_j sum(M_T,j w_j)``."""
    def objective(floats, initial, segment_ids, weights, memory_weights):
        y, memory = atlas_memory(AtlasInputs(*floats[:7], segment_ids, *floats[7:]), initial, settings, impl=impl,
                                 return_memory=True)
        loss = jnp.sum(y * weights) + sum(jnp.sum(m * w) for m, w in zip(memory, memory_weights))
        return loss, (y, memory)
    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))


def evaluate_with_memory(impl, inputs, initial, settings):
    weights = jax.random.normal(jax.random.key(7), inputs.values.shape)
    memory_weights = tuple(jax.random.normal(jax.random.key(8 + i), (BATCH, *w.shape)) for i, w in enumerate(initial))
    floats = tuple(inputs[:7]) + (() if inputs.norm_gain is None else (inputs.norm_gain,))
    (_, (y, memory)), grads = value_and_grads_with_memory(impl, settings)(
        floats, initial, inputs.segment_ids, weights, memory_weights)
    return y, memory, grads


# deep-c3-b4-k5-update (the other tests' case) is the norm case's path less the norm: deep memory, eta on the
# update, window 3 over chunks of 4, ragged; the deep memory without the norm is deep-c2-b3-k5-polar-clip's.
@pytest.mark.parametrize("case", [pytest.param(name, marks=pytest.mark.slow) if name.endswith("-norm") or name in (
    "deep-c2-b3-k5-polar-clip",) else name for name in sorted(CHUNK_CASES) if name != "deep-c3-b4-k5-update"])
def test_chunk_granularity_chunked_form_matches_its_token_by_token_reference(case):
    inputs, initial, settings = chunk_settings_for(case)
    y, memory, grads = evaluate_with_memory("xla", inputs, initial, settings)
    y_ref, memory_ref, grads_ref = evaluate_with_memory("reference", inputs, initial, settings)
    tolerance = scale_tolerance(settings)
    assert np.abs(np.asarray(y_ref)).max() > 0.1
    np.testing.assert_allclose(y, y_ref, atol=tolerance * np.abs(y_ref).max(), rtol=0)
    for got, want in zip(memory, memory_ref):
        np.testing.assert_allclose(got, want, atol=tolerance * np.abs(want).max(), rtol=0)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        np.testing.assert_allclose(got, want, atol=tolerance * max(float(np.abs(want).max()), 1e-6), rtol=0)
    assert float(np.abs(grads_ref[1][0]).max()) > 0  # gradients reach the initial memory


def test_chunk_granularity_with_chunk_size_one_keeps_the_token_rule_memory_and_differs_from_it_beyond():
    # b = 1: every token settles its chunk, M_t = alpha_t M_{t-1} + eta_t NS_k(S_t), the token rule's memory
    # (its read is the linearised M_{t-1} + eta_t S_t, not the token rule's).
    inputs, initial, settings = chunk_settings_for("deep-c3-b4-k5-update")
    token = dataclasses.replace(settings, ns_granularity="token")
    one = functools.partial(atlas_memory, impl="xla", return_memory=True)
    _, m_chunk = one(inputs, initial, dataclasses.replace(settings, chunk_size=1))
    _, m_token = one(inputs, initial, dataclasses.replace(token, chunk_size=1))
    tolerance = scale_tolerance(settings)
    for got, want in zip(m_chunk, m_token):
        np.testing.assert_allclose(got, want, atol=tolerance * float(np.abs(want).max()), rtol=0)
    y_chunk4, y_token4 = one(inputs, initial, settings)[0], one(inputs, initial, token)[0]
    assert float(np.abs(y_chunk4 - y_token4).max()) > 1e-2  # b = 4: a different rule


@pytest.mark.parametrize("split", [5, 8])  # mid-chunk, and at a chunk boundary (b = 4)
def test_chunk_granularity_decoding_from_the_state_equals_the_training_form(split):
    inputs, initial, settings = chunk_settings_for("deep-c3-b4-k5-update")
    one_document = inputs._replace(segment_ids=jnp.ones_like(inputs.segment_ids))
    state = init_state(BATCH, initial, settings)
    outputs = []
    for part in (slice(0, split), slice(split, None)):
        state, y = atlas_memory_step(state, jax.tree.map(lambda x, part=part: x[:, part], one_document), initial,
                                     settings, impl="xla")
        outputs.append(y)
    expected, memory = atlas_memory(one_document, initial, settings, impl="xla", return_memory=True)
    tolerance = scale_tolerance(settings)
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), expected, atol=tolerance, rtol=tolerance)
    assert int(state["position"]) == LENGTH and state["ns_scale"].shape == (BATCH, HEADS)
    # LENGTH 10 = two chunks and 2 tokens: the state's memory waits for its chunk end; settled, it is M_T.
    settled = settled_memory(state, settings, impl="xla")
    for got, want in zip(settled, memory):
        np.testing.assert_allclose(got, want, atol=tolerance * float(np.abs(want).max()), rtol=0)
    assert float(np.abs(state["memory"][0] - memory[0]).max()) > 1e-3


def test_bad_ns_granularity_is_rejected():
    with pytest.raises(ValueError, match="ns_granularity must be 'token' .* or 'chunk'"):
        AtlasSettings(MemoryLayout(4, 4), window=1, chunk_size=4, ns_steps=1, ns_granularity="row")


SPLITS = (4, 8)  # after 4 tokens (row 0's second document crosses it), after 8 (row 0's third starts there)


@functools.cache
def split_value_and_grads(impl, settings: AtlasSettings):
    """jit of ``(y, grads)`` of ``sum(y * w)`` over a row run as three parts, cut at ``SPLITS``: the second from the
    first's ``return_state`` (and returning its own), the third from the second's; a part's first token continues
    the state's document where the segment id does not change at the cut."""
    def outputs(floats, initial, segment_ids):
        inputs = AtlasInputs(*floats[:7], segment_ids, *floats[7:])
        bounds = (0, *SPLITS, segment_ids.shape[1])
        state, parts = None, []
        for start, stop in zip(bounds[:-1], bounds[1:]):
            part = AtlasInputs(*(x[:, start:stop] for x in inputs[:8]), inputs.norm_gain)
            carried = {} if state is None else {
                "initial_state": state, "continues": segment_ids[:, start] == segment_ids[:, start - 1]}
            if stop < segment_ids.shape[1]:
                y, state = atlas_memory(part, initial, settings, impl=impl, return_state=True, **carried)
            else:
                y = atlas_memory(part, initial, settings, impl=impl, **carried)
            parts.append(y)
        return jnp.concatenate(parts, axis=1)

    def objective(floats, initial, segment_ids, weights):
        y = outputs(floats, initial, segment_ids)
        return jnp.sum(y * weights), y
    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))


def assert_split_row_continues(impl, inputs, initial, settings, check):
    """The row run as the three parts of ``split_value_and_grads`` gives the oracle's outputs and gradients over the
    row run whole (``evaluate``: the same objective), each by ``check(got, want, tolerance, what)``: the state after
    a cut carries the memory, the momentum and the window (and under ``ns_granularity = "chunk"`` the read memory
    and the pending Newton-Schulz scale) on, within a document and into a new one."""
    weights = jax.random.normal(jax.random.key(7), inputs.values.shape)
    floats = tuple(inputs[:7]) + (() if inputs.norm_gain is None else (inputs.norm_gain,))
    expected, expected_grads = evaluate(reference, inputs, initial, settings)
    (_, y), grads = split_value_and_grads(impl, settings)(floats, initial, inputs.segment_ids, weights)
    tolerance = scale_tolerance(settings)  # float32: the oracle's (the carried window's terms in another order)
    check(y, expected, tolerance, "y")
    check(grads, expected_grads, tolerance, "gradients")


def assert_close_to_scale(got, want, tolerance, what):
    for actual, wanted in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(actual, wanted, atol=tolerance * float(np.abs(wanted).max()), rtol=0, err_msg=what)


# Each kind of state, once: the reference's token state (its scan from a state is the same for every memory and
# window) and its chunk state; the xla carry with a window reaching past a chunk (linear, c = 6 > b = 4), with no
# window at all (c = 1, deep memory, clipped) and under ns_granularity = "chunk" (deep, ragged last chunk).
@pytest.mark.parametrize("case,impl", [("linear-p1-c6-b4-k0", "reference")] + [
    pytest.param(name, impl, marks=pytest.mark.slow) for name, impl in (
        ("linear-p1-c6-b4-k0", "xla"), ("deep-p1-c1-b4-k0-clip", "xla"),
        ("chunk:deep-c3-b4-k5-update", "xla"), ("chunk:deep-c3-b4-k5-update", "reference"))])
def test_a_row_split_at_a_chunk_boundary_continues_from_the_first_parts_state(case, impl):
    """Cut after 4 tokens (row 0's second document crosses the cut) and after 8 (row 0's third starts there):
    the three parts, each from the state of the one before, give the whole row's outputs and gradients."""
    name = case.removeprefix("chunk:")
    inputs, initial, settings = chunk_settings_for(name) if case.startswith("chunk:") else settings_for(name)
    assert_split_row_continues(impl, inputs, initial, settings, assert_close_to_scale)


def test_return_state_needs_a_row_on_the_chunk_grid():
    inputs, initial, settings = settings_for("linear-p1-c6-b4-k0")
    with pytest.raises(ValueError, match="return_state needs rows of a multiple of chunk_size=4"):
        atlas_memory(inputs, initial, settings, impl="xla", return_state=True)
