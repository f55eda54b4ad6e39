"""Looped padded transformer for language recognition (``model.kind: looped``).

For a string ``w`` of N symbols the model reads ``[BOS] w_1 .. w_N [PAD] x P(N) [CLS]`` (T = N + P(N) + 2
positions) and answers accept / reject at [CLS]::

    e       = Prelude(Embed(tokens))                 prelude_layers distinct blocks (0-2)
    x_0     = 0 if reinject else e
    x_{i+1} = Block(x_i + e) if reinject else Block(x_i),     i = 0 .. loops(N) - 1, ONE shared Block
    y       = Coda(x_loops(N))                       coda_layers distinct blocks (0-2)
    logits  = RMSNorm(y[CLS]) @ W_out                 next-token logits after [CLS]: <accept> vs <reject>

    loops(N) = max(1, ceil(c * log2 N) + d)   (loop_schedule log; fixed_loops when fixed)
    P(N)     = ceil(a * N^e)                  (padding_scale a = 0: no padding)

[PAD] is a learned vector, inserted by the model, so the data carries only ``[BOS] w [CLS]`` (see
``seqmodels.data.cfl.rows``). Every block is the decoder LM's pre-norm ``Block`` (a mixer, then
SwiGLU) around the registered mixer ``model.looped.mixer`` (default ``attention``; a looped Gated
DeltaNet is ``model.looped.mixer=gated_deltanet``), called through the ``Mixer`` interface with
segment id 1 on the ``[BOS] w [PAD]* [CLS]`` positions and 0 on the empty ones after, at positions
0 .. T-1. Attention is bidirectional or causal over those positions (``model.looped.attention``,
which sets ``model.attention.causal`` for the blocks), with RoPE at positions 0 .. T-1. RoPE puts no position into the residual stream (values are not
rotated), so a query cannot aim at a position computed from the input, such as the mirror
``2m - j`` of position j about the centre m of ``w#w^R``; ``positions: rope+sinusoidal`` adds fixed
sinusoidal features of the position to the embeddings, in which such targets are bilinear. With
``share_weights: false`` the loop runs ``fixed_loops`` distinct blocks instead of one: a fixed-depth
transformer from the same code.

**How a batch carries N.** Each row holds one example at its front: ``segment_ids`` is 1 on its
N + 2 tokens and 0 after them. Shapes are static per row length L: the model lays every row out on
T_max = L + P(L - 2) positions (its own padding, then [CLS], then empty positions no query sees)
and runs ``loops(L - 2)`` iterations, but row b takes the update only while ``i < loops(N_b)``:

    x_{i+1}[b] = Block(...)[b]  if i < loops(N_b)  else  x_i[b]

so a mixed-length training batch computes, row by row, exactly what each example computes alone
(the test ``test_read_out_of_a_mixed_length_batch_equals_each_example_alone``). Evaluation groups
examples by length (rows of exactly N + 2 tokens), so no work is masked there.

**Context parallelism.** Under ``mesh.context = C`` the padded layout of T_max positions is split into C
contiguous shards like any row: each block's mixer runs its split form (``seqmodels.layers.context_attention``:
bidirectional attention gathers the keys, or closes the ring, so [CLS] still reads every symbol; the
recurrent mixers pass their state). T_max is rounded up to a multiple of C with empty positions (segment 0,
seen by no query), so the read-out equals the unsplit model's; the read-out gathers one ``[B, D]`` row.
Communication is the block mixer's, once per loop iteration.

**Remat per loop iteration.** The loop is a ``lax.scan`` over iterations whose body is wrapped in
``jax.checkpoint`` when ``model.remat`` is not ``none``. The backward pass then keeps only each
iteration's input ``x_i`` (``[B, T, D]``) and recomputes the block's internals (attention scores
``[B, H, T, T]``, the MLP hidden ``[B, T, F]``) one iteration at a time: the activation memory of
the block is paid once, not once per loop, and compile time does not grow with the loop count.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.config_looped import LoopedConfig
from seqmodels.layers.common import param
from seqmodels.layers.norms import RMSNorm
from seqmodels.layers.rotary import sinusoidal_positions
from seqmodels.mixers import check_mixer_names, mixer_flops_per_token
from seqmodels.models.lm import REMAT_POLICIES, Block
from seqmodels.sharding import constrain, sequence_shards
from seqmodels.special_tokens import ACCEPT_ID, REJECT_ID


def num_loops(config: LoopedConfig, length: int) -> int:
    """``loops(N)``: ``max(1, ceil(c log2 N) + d)`` for the log schedule (N = 0 counts as 1), else ``fixed_loops``."""
    if config.loop_schedule == "fixed":
        return config.fixed_loops
    return max(1, math.ceil(config.loops_scale * math.log2(max(length, 1))) + config.loops_offset)


def num_padding(config: LoopedConfig, length: int) -> int:
    """``P(N) = ceil(a N^e)`` padding tokens (0 when a = 0)."""
    if config.padding_scale == 0:
        return 0
    return math.ceil(config.padding_scale * max(length, 0) ** config.padding_exponent)


def row_layout(config: LoopedConfig, lengths: jax.Array, max_length: int) -> dict:
    """Per-row ``length`` N, ``padding`` P(N), ``loops`` loops(N) and ``readout`` index of [CLS] (``[B]`` ints).

    The rule is evaluated in Python for every N in ``[0, max_length]`` and looked up, so the traced
    model uses exactly ``num_loops`` / ``num_padding``.
    """
    loops_table = jnp.asarray([num_loops(config, n) for n in range(max_length + 1)], jnp.int32)
    padding_table = jnp.asarray([num_padding(config, n) for n in range(max_length + 1)], jnp.int32)
    lengths = jnp.clip(lengths, 0, max_length)
    padding = padding_table[lengths]
    return {"length": lengths, "padding": padding, "loops": loops_table[lengths],
            "readout": lengths + padding + 1}


def padded_length(config: LoopedConfig, row_length: int, shards: int = 1) -> int:
    """``T_max = L + P(L - 2)`` positions of the layout, rounded up to a multiple of ``shards`` (module docstring)."""
    total = row_length + num_padding(config, row_length - 2)
    return -(-total // shards) * shards


def block_config(config: ModelConfig) -> ModelConfig:
    """The config the blocks are built from: ``model.attention.causal`` set by ``model.looped.attention``."""
    causal = config.looped.attention == "causal"
    return dataclasses.replace(config, attention=dataclasses.replace(config.attention, causal=causal))


def _apply(block: Block, x: jax.Array, segment_ids: jax.Array, positions: jax.Array) -> jax.Array:
    return block(x, segment_ids=segment_ids, positions=positions)[0]


class LoopedModel(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        looped = config.looped
        check_mixer_names([looped.mixer], key="model.looped.mixer")
        self.config = config
        self.embed = param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"), std=config.init_std)
        self.pad_embedding = param(rngs, (config.d_model,), ("embed",), std=config.init_std)
        blocks = block_config(config)

        def make(count: int) -> nnx.List:
            return nnx.List([Block(looped.mixer, blocks, rngs) for _ in range(count)])

        self.prelude = make(looped.prelude_layers)
        self.blocks = make(1 if looped.share_weights else looped.fixed_loops)
        self.coda = make(looped.coda_layers)
        self.final_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = None if config.tie_embeddings else param(
            rngs, (config.d_model, config.vocab_size), ("embed", "vocab"), std=config.init_std)

    def max_loops(self, row_length: int) -> int:
        """Loop iterations a forward over rows of ``row_length`` tokens runs (the longest row's count)."""
        return num_loops(self.config.looped, row_length - 2)

    def layout(self, tokens: jax.Array, segment_ids: jax.Array | None) -> dict:
        row_length = tokens.shape[1]
        if segment_ids is None:
            lengths = jnp.full((tokens.shape[0],), row_length - 2, jnp.int32)
        else:
            lengths = jnp.sum(segment_ids != 0, axis=1).astype(jnp.int32) - 2
        return row_layout(self.config.looped, lengths, row_length - 2)

    def _embed_padded(self, tokens: jax.Array, layout: dict) -> tuple[jax.Array, jax.Array]:
        """``[BOS] w [PAD]*P [CLS]`` embedded on T_max positions ``[B, T, D]``, and which positions are tokens."""
        row_length = tokens.shape[1]
        total = padded_length(self.config.looped, row_length, sequence_shards())
        index = jnp.arange(total)[None, :]
        length, readout = layout["length"][:, None], layout["readout"][:, None]
        source = jnp.where(index <= length, index, jnp.where(index == readout, length + 1, 0))
        dtype = jnp.dtype(self.config.compute_dtype)
        x = jnp.take(self.embed.get_value(), jnp.take_along_axis(tokens, source, axis=1), axis=0)
        is_pad = (index > length) & (index < readout)
        x = jnp.where(is_pad[..., None], self.pad_embedding.get_value(), x)
        if self.config.looped.positions == "rope+sinusoidal":
            # amplitude sqrt(2) init_std: a (sin, cos) pair has the expected norm of two embedding entries
            features = sinusoidal_positions(index, self.config.d_model, self.config.attention.rope_theta)
            x = x + math.sqrt(2.0) * self.config.init_std * features
        x = x.astype(dtype)
        return constrain(x, ("batch", "seq", "embed")), index <= readout

    def _run_loop(self, x, inject, segments, positions, loops, max_loops: int):
        """``max_loops`` iterations of the shared (or per-iteration) block; row b updates while ``i < loops[b]``."""
        reinject, shared = self.config.looped.reinject, self.config.looped.share_weights
        split = [nnx.split(block) for block in self.blocks]
        graphdef, shared_state = split[0]
        # Distinct blocks: the scan walks their states stacked on a leading axis, one per iteration.
        per_step = None if shared else jax.tree.map(lambda *leaves: jnp.stack(leaves), *(s for _, s in split))

        def iteration(x, step):
            index, step_state = step
            block = nnx.merge(graphdef, shared_state if shared else step_state)
            updated = _apply(block, x + inject if reinject else x, segments, positions)
            return jnp.where((index < loops)[:, None, None], updated, x), None

        if self.config.remat != "none":
            iteration = jax.checkpoint(iteration, policy=REMAT_POLICIES[self.config.remat])
        x, _ = jax.lax.scan(iteration, x, (jnp.arange(max_loops), per_step))
        return x

    def hidden(self, tokens: jax.Array, segment_ids: jax.Array | None = None) -> tuple[jax.Array, dict]:
        """The final hidden states ``[B, T, D]`` over the padded layout, and the layout."""
        layout = self.layout(tokens, segment_ids)
        x, valid = self._embed_padded(tokens, layout)
        segments = valid.astype(jnp.int32)  # 1 on [BOS] w [PAD]* [CLS], 0 on the empty positions after
        positions = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
        for block in self.prelude:
            x = _apply(block, x, segments, positions)
        inject = x
        start = jnp.zeros_like(x) if self.config.looped.reinject else x
        max_loops = self.max_loops(tokens.shape[1])
        x = self._run_loop(start, inject, segments, positions, layout["loops"], max_loops)
        for block in self.coda:
            x = _apply(block, x, segments, positions)
        return x, layout

    def __call__(self, tokens, *, segment_ids=None, positions=None):
        """Logits ``[B, vocab]`` (float32) of the token after [CLS], one row per example.

        ``tokens: [B, L]`` hold ``[BOS] w [CLS]`` then empty positions, marked by ``segment_ids``
        (None: every row is L tokens long). ``positions`` is accepted for the model interface and
        unused: positions are those of the padded layout.
        """
        x, layout = self.hidden(tokens, segment_ids)
        readout = jnp.take_along_axis(x, layout["readout"][:, None, None], axis=1)[:, 0]
        readout = self.final_norm(readout)
        head = self.embed.get_value().T if self.head is None else self.head.get_value()
        return jnp.dot(readout, head.astype(readout.dtype), preferred_element_type=jnp.float32)

    def loss(self, batch: dict):
        """Summed binary cross-entropy of the label at [CLS], weighted by ``loss_mask`` there, and the weight.

        The softmax runs over the two label logits ``(<reject>, <accept>)`` only, the decision the
        evaluation reads. A softmax over the whole vocabulary first has to push the other tokens down,
        which the tied read-out does with one input-independent direction of the [CLS] state; after
        the final RMSNorm that direction swamps the string's signal and training sits at ln 2.
        """
        logits = self(batch["inputs"], segment_ids=batch.get("segment_ids"))
        cls_index = self.layout(batch["inputs"], batch.get("segment_ids"))["length"][:, None] + 1
        labels = jnp.take_along_axis(batch["targets"], cls_index, axis=1)[:, 0]
        weights = jnp.take_along_axis(batch["loss_mask"], cls_index, axis=1)[:, 0].astype(jnp.float32)
        weights = weights * ((labels == ACCEPT_ID) | (labels == REJECT_ID))  # any other target is no label
        label_logits = logits[:, jnp.asarray([REJECT_ID, ACCEPT_ID])]
        losses = optax.softmax_cross_entropy_with_integer_labels(label_logits, (labels == ACCEPT_ID).astype(jnp.int32))
        return jnp.sum(losses * weights), jnp.sum(weights)

    def flops_per_token(self, seq_len: int) -> float:
        return looped_flops_per_token(self.config, seq_len)


def looped_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per input token of rows of ``seq_len`` tokens (N_max = seq_len - 2).

    Every block runs on all ``T = seq_len + P(N_max)`` padded positions, ``prelude + loops(N_max) +
    coda`` times (rows with fewer loops are masked, not skipped): its mixer's registry formula over
    rows of T (attention: keys seen per query T bidirectional, (T + 1) / 2 causal) plus SwiGLU
    ``6 D F``; the read-out head ``2 D V`` runs once per row.
    """
    looped = config.looped
    total = seq_len + num_padding(looped, seq_len - 2)
    blocks = looped.prelude_layers + num_loops(looped, seq_len - 2) + looped.coda_layers
    mlp = 6 * config.d_model * config.mlp_hidden if config.mlp else 0
    per_position = mixer_flops_per_token(looped.mixer, block_config(config), total) + mlp
    per_row = blocks * total * per_position + 2 * config.d_model * config.vocab_size
    return per_row / seq_len


def parameter_count(model: nnx.Module) -> int:
    """Number of parameters of ``model`` (also of an abstract one from ``nnx.eval_shape``)."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
