"""A full-attention model trained on a RULER task's own format learns it at a short length (the task is learnable
and the suite scores what the model learned)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from seqmodels.config_io import load_config
from seqmodels.data.ruler_tasks import answer_text, ruler_examples
from seqmodels.data.tokenizers import ByteTokenizer
from seqmodels.evaluation.ruler import evaluate_ruler
from seqmodels.models.kinds import build_model

LENGTH, BATCH, STEPS = 448, 16, 400


def training_rows(step: int):
    """``BATCH`` niah_single_1 prompts followed by their answer; loss on the answer (and the token closing it)."""
    tokenizer = ByteTokenizer()
    depths = np.random.default_rng(step).random(BATCH).tolist()
    rows = np.zeros((BATCH, LENGTH), np.int32)
    mask = np.zeros((BATCH, LENGTH), np.float32)
    for i, depth in enumerate(depths):  # seeds from 10_000 up: apart from the evaluation's seed 0
        example, = ruler_examples("niah_single_1", tokenizer, length=LENGTH, depths=[depth], per_depth=1,
                                  seed=10_000 + step * BATCH + i)
        answer = np.r_[tokenizer.encode(answer_text(example.references)), tokenizer.eos_id]
        row = np.r_[example.prompt, answer]
        rows[i, :row.size] = row
        mask[i, example.prompt.size:row.size] = 1.0
    return rows, mask


@pytest.mark.slow
def test_a_small_attention_model_trained_on_single_needle_rows_retrieves_the_needle():
    config = load_config(None, ["model.d_model=64", "model.num_heads=4", "model.mixers=[attention] * 2",
                                f"model.max_seq_len={LENGTH}", "data.seq_len=64"])
    model = build_model(config.model, seed=0)
    before = evaluate_ruler(model, config, tasks=["niah_single_1"], lengths=[LENGTH], depths=[0.0, 0.5, 1.0],
                            per_depth=4, seed=0, batch_size=12)["tasks"]["niah_single_1"]["by_length"][str(LENGTH)]
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 3e-3, 20, STEPS), weight_decay=0.0)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, rows, mask):
        def loss(params):
            inputs = rows[:, :-1]
            logits, _ = nnx.merge(graphdef, params)(inputs, segment_ids=jnp.ones_like(inputs),
                                                    positions=jnp.broadcast_to(jnp.arange(inputs.shape[1]),
                                                                               inputs.shape))
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, rows[:, 1:])
            return (losses * mask[:, 1:]).sum() / mask[:, 1:].sum()
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    for number in range(STEPS):
        params, state, value = step(params, state, *map(jnp.asarray, training_rows(number)))
    nnx.update(model, params)
    after = evaluate_ruler(model, config, tasks=["niah_single_1"], lengths=[LENGTH], depths=[0.0, 0.5, 1.0],
                           per_depth=4, seed=0, batch_size=12)["tasks"]["niah_single_1"]["by_length"][str(LENGTH)]
    assert before["score"] == 0.0
    assert after["score"] >= 0.75, (float(value), after["samples"])
