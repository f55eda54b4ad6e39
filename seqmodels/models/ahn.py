"""AHN (``model.kind: ahn``): a frozen Transformer++ whose attention keeps sinks + a sliding window, with a
learned compressor per layer for the tokens that leave the window (Artificial Hippocampus Networks,
arXiv 2510.07318). Per layer l of the base, with ``h = RMSNorm_l(x)`` and the layer's own post-RoPE
``q, k, v``::

    a_t = SWA(q, k, v)_t      over the first ``sinks`` tokens and the last ``ring = window - sinks``
    m_t = Compressor_l(h, q, k, v)_t        the tokens ``sinks <= s <= t - ring`` (``ahn_compressor.py``)
    x  <- x + W_o (a_t + m_t);   x <- x + MLP_l(RMSNorm(x))

The teacher is the same weights with full causal attention.

With the row split over ``mesh.context`` (training and the distillation loss; decoding is unchanged) the
teacher's attention gathers the keys or rings them (``model.attention.context_impl``), the student's window
takes a halo of the previous shard's last ``ring - 1`` keys / values and the row's sinks
(``seqmodels.layers.context_attention``), and the compressor a halo of the ``ring`` tokens it evicts next
and the recurrent state passed by a prefix scan (``ahn_compressor``): communication per layer is the
teacher's all-gather (or ring) of ``[B, T, Hkv, Dh]`` keys and values, the student's ``ring - 1`` + ``ring``
token halos and ``C sinks`` sink tokens, and ceil(log2 C) + 1 float32 ``[B, H, Dh, Dh]`` state messages.
A ``random_window`` draw is traced, so its window and evicted stream gather the row instead of a halo. Rows are one stream each (positions
``0 .. T-1``; segment ids are not used: a packed row is one long context). The parameter tree is the
decoder LM's (``embed``, ``blocks/i/{mixer_norm, mixer, mlp_norm, mlp}``, ``final_norm``, ``head`` when
untied: what ``seqmodels.hf.load_pretrained_params`` of the base gives) plus one subtree
``blocks/i/ahn`` per layer; only ``ahn`` subtrees train (``trainable_path``). ``model.remat`` rematerialises
each student layer (its policies as for an LM); the teacher keeps no residuals (it is under ``stop_gradient``),
so with ``remat=full`` the backward holds one ``[B, T, D]`` input per layer and one layer's attention at a time.

Training loss (``loss``): KL(teacher || student) summed over the vocabulary, averaged over the positions
``>= window`` (``ahn_loss.chunked_kl``). With ``model.ahn.random_window`` each step draws ``(window,
sinks)`` from ``window_choices`` keyed by the step (``batch["step"]``, which the train step supplies).

Decoding (``init_cache`` / ``__call__(tokens, cache=...)``, so ``seqmodels.models.generate`` works) keeps
per layer the sink keys/values, a ring of the window's keys/values (with each token's write gates) and
the compressor state; the token a new one overwrites in the ring is written into the state first. The
cache size is fixed by ``window``: it does not grow with the length decoded. Decoding steps one token at a
time; a prompt into a fresh cache (position 0) runs as one parallel pass, the training forward's, and builds
the cache the steps would have left (``AHNBlock.prefill``), so a long prompt costs one forward, not one
scan step per token; more tokens after earlier ones step through the cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.layers.attention import attend, visibility_mask
from seqmodels.layers.common import param
from seqmodels.layers.context import sequence_is_split
from seqmodels.layers.context_attention import split_attention
from seqmodels.layers.mlp import SwiGLU
from seqmodels.layers.norms import RMSNorm
from seqmodels.mixers.attention import Attention, _flops as attention_flops
from seqmodels.models.lm import REMAT_POLICIES
from seqmodels.models.ahn_compressor import Compressor, compressor_flops_per_token
from seqmodels.models.ahn_loss import chunked_kl, window_choices
from seqmodels.sharding import sequence_shards

TRAINABLE_SUBTREE = "ahn"
MODES = ("ahn", "swa", "teacher")  # what an AHN run decodes as (``with_mode``)


def trainable_path(path) -> bool:
    """Whether the parameter at ``path`` (a key path of the pure parameter dict) belongs to a compressor."""
    return TRAINABLE_SUBTREE in [str(getattr(part, "key", part)) for part in path]


def slot_positions(length: int, window: int, sinks: int) -> np.ndarray:
    """``[window]`` ints: the position each decoding cache slot holds after tokens ``0 .. length - 1`` (slot
    ``p`` for a sink ``p < sinks``, ``sinks + (p - sinks) % ring`` for the others, the latest one kept), -1 for
    a slot not yet written."""
    ring = window - sinks
    held = np.full(window, -1, np.int64)
    held[:min(sinks, length)] = np.arange(min(sinks, length))
    for slot in range(ring):
        first = sinks + slot
        if first < length:
            held[sinks + slot] = first + ring * ((length - 1 - first) // ring)
    return held


class AHNBlock(nnx.Module):
    """One layer of the base (parameter names as ``seqmodels.models.lm.Block``) and its compressor ``ahn``."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.mixer_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mixer = Attention(config, window=None, num_sinks=0, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.mlp_hidden, rngs=rngs, std=config.init_std)
        self.ahn = Compressor(config, rngs=rngs)

    def _finish(self, x, heads):
        x = x + self.mixer.out(heads)
        return x + self.mlp(self.mlp_norm(x))

    def full(self, x, positions):
        """The teacher: the base layer with full causal attention."""
        h = self.mixer_norm(x)
        q, k, v, _ = self.mixer._project(h, positions)
        if sequence_is_split(x.shape[1]):
            return self._finish(x, split_attention(q, k, v, None, positions, window=None, num_sinks=0, causal=True,
                                                   context_impl=self.mixer.context_impl,
                                                   context_layout=self.mixer.context_layout))
        return self._finish(x, attend(q, k, v))

    def _window_attention(self, q, k, v, positions, *, ring, sinks):
        """Attention over the row's sinks and the last ``ring`` tokens (split over ``context`` when it is)."""
        if sequence_is_split(q.shape[1]):
            return split_attention(q, k, v, None, positions, window=ring, num_sinks=sinks, causal=True)
        ones = jnp.ones(positions.shape, jnp.int32)
        return attend(q, k, v, visibility_mask(ones, positions, ones, positions, window=ring, num_sinks=sinks))

    def windowed(self, x, positions, *, ring, sinks, compress: bool = True):
        """The student (``compress``) or sliding window + sinks alone; ``ring``/``sinks`` may be traced."""
        h = self.mixer_norm(x)
        q, k, v, _ = self.mixer._project(h, positions)
        heads = self._window_attention(q, k, v, positions, ring=ring, sinks=sinks)
        if compress:
            heads = heads + self.ahn(h, q, k, v, ring=ring, sinks=sinks).astype(heads.dtype)
        return self._finish(x, heads)

    def prefill(self, x, positions, *, window: int, sinks: int):
        """The student layer over a whole prompt ``x [B, P, D]`` from position 0 (``windowed``), and the cache
        ``decode`` would hold after stepping through the same ``P`` tokens: the sinks, the ring slots' latest
        tokens with their write gates, and the compressor state of the tokens evicted so far."""
        ring, (batch, length) = window - sinks, x.shape[:2]
        h = self.mixer_norm(x)
        q, k, v, _ = self.mixer._project(h, positions)
        heads = self._window_attention(q, k, v, positions, ring=ring, sinks=sinks)
        memory, state = self.ahn(h, q, k, v, ring=ring, sinks=sinks, return_state=True)
        strength, log_decay = self.ahn.write_gates(h)
        held = jnp.asarray(slot_positions(length, window, sinks))  # [window]: the position each slot holds, or -1
        take = jnp.clip(held, 0, length - 1)
        written = held >= 0

        def slots(values, fill):
            kept = jnp.take(values, take, axis=1)
            return jnp.where(written.reshape((1, window) + (1,) * (values.ndim - 2)), kept, fill)

        cache = {"k": slots(k.astype(x.dtype), 0), "v": slots(v.astype(x.dtype), 0),  # init_cache's dtypes
                 "strength": slots(strength, 0.0), "log_decay": slots(log_decay, 0.0),
                 "positions": jnp.broadcast_to(held.astype(jnp.int32), (batch, window)), "state": state}
        return self._finish(x, heads + memory.astype(heads.dtype)), cache

    def decode(self, x, position, cache: dict, *, window: int, sinks: int):
        """One token ``x [B, 1, D]`` at ``position`` (a scalar) through the layer; returns ``(x, cache)``."""
        batch = x.shape[0]
        ring = window - sinks
        h = self.mixer_norm(x)
        positions = jnp.full((batch, 1), position, jnp.int32)
        q, k, v, _ = self.mixer._project(h, positions)
        strength, log_decay = self.ahn.write_gates(h)
        slot = jnp.where(position < sinks, position, sinks + (position - sinks) % ring)
        leaving = position >= window  # the slot holds token position - ring, which now leaves the window
        evicted = {"k": cache["k"][:, slot][:, None].astype(q.dtype), "v": cache["v"][:, slot][:, None].astype(q.dtype),
                   "strength": jnp.where(leaving, cache["strength"][:, slot], 0.0)[:, None],
                   "log_decay": jnp.where(leaving, cache["log_decay"][:, slot], 0.0)[:, None]}
        memory, state = self.ahn.step(h, q, evicted, cache["state"])
        cache = {"k": cache["k"].at[:, slot].set(k[:, 0].astype(cache["k"].dtype)),
                 "v": cache["v"].at[:, slot].set(v[:, 0].astype(cache["v"].dtype)),
                 "strength": cache["strength"].at[:, slot].set(strength[:, 0]),
                 "log_decay": cache["log_decay"].at[:, slot].set(log_decay[:, 0]),
                 "positions": cache["positions"].at[:, slot].set(position), "state": state}
        mask = (cache["positions"] >= 0)[:, None, None, :]
        heads = attend(q, cache["k"].astype(q.dtype), cache["v"].astype(q.dtype), mask)
        return self._finish(x, heads + memory.astype(heads.dtype)), cache

    def init_cache(self, batch_size: int, window: int, dtype) -> dict:
        kv_shape = (batch_size, window, self.mixer.kv_heads, self.mixer.head_dim)
        gate_shape = (batch_size, window, self.ahn.heads)
        return {"k": jnp.zeros(kv_shape, dtype), "v": jnp.zeros(kv_shape, dtype),
                "strength": jnp.zeros(gate_shape, jnp.float32), "log_decay": jnp.zeros(gate_shape, jnp.float32),
                "positions": jnp.full((batch_size, window), -1, jnp.int32), "state": self.ahn.init_state(batch_size)}


def _student_layer(ring, sinks, compress: bool):
    """``(block, x, positions) -> x`` through the student layer; ``ring`` / ``sinks`` (ints or traced) closed over,
    so a fixed window stays static under ``nnx.remat``."""
    def layer(block: AHNBlock, x, positions):
        return block.windowed(x, positions, ring=ring, sinks=sinks, compress=compress)
    return layer


class AHNModel(nnx.Module):
    """The frozen base with a compressor per layer (module docstring)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"), std=config.init_std)
        self.blocks = nnx.List([AHNBlock(config, rngs) for _ in config.mixers])
        self.final_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = None if config.tie_embeddings else param(
            rngs, (config.d_model, config.vocab_size), ("embed", "vocab"), std=config.init_std)

    def _embed(self, tokens):
        """``(x [B, T, D], positions [B, T])`` of a row read from position 0."""
        batch, length = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        return jnp.take(self.embed.get_value(), tokens, axis=0).astype(jnp.dtype(self.config.compute_dtype)), positions

    def hidden(self, tokens, *, window=None, sinks=0, compress: bool = True):
        """Final-normed hidden states ``[B, T, D]``: the teacher (``window=None``), the student, or (``compress=
        False``) sliding window + sinks alone. ``window``/``sinks`` may be traced integers."""
        x, positions = self._embed(tokens)
        remat = window is not None and self.config.remat != "none"
        for block in self.blocks:
            if window is None:
                x = block.full(x, positions)
            elif remat:  # window and sinks stay Python ints where they are (a fixed window keeps its halo)
                x = nnx.remat(_student_layer(window - sinks, sinks, compress),
                              policy=REMAT_POLICIES[self.config.remat])(block, x, positions)
            else:
                x = block.windowed(x, positions, ring=window - sinks, sinks=sinks, compress=compress)
        return self.final_norm(x)

    def head_matrix(self) -> jax.Array:
        """``[D, vocab]``: the output projection (the embedding transposed when tied)."""
        return self.embed.get_value().T if self.head is None else self.head.get_value()

    def logits(self, hidden) -> jax.Array:
        return jnp.dot(hidden, self.head_matrix().astype(hidden.dtype), preferred_element_type=jnp.float32)

    def __call__(self, tokens, *, segment_ids=None, positions=None, cache=None):
        """Student logits ``[B, T, vocab]`` at ``model.ahn.window`` / ``sinks``; with ``cache``, streaming decode."""
        del segment_ids, positions  # one stream per row (module docstring)
        settings = self.config.ahn
        if cache is None:
            return self.logits(self.hidden(tokens, window=settings.window, sinks=settings.sinks)), None
        if tokens.shape[1] == 1:
            return self._stream(tokens, cache)
        # a prompt into a fresh cache runs as one parallel pass; more tokens after earlier ones step through
        return jax.lax.cond(cache["position"] == 0, lambda: self._prefill(tokens, cache),
                            lambda: self._stream(tokens, cache))

    def _prefill(self, tokens, cache):
        """The student's forward over ``tokens`` from position 0 and the cache it leaves (``AHNBlock.prefill``)."""
        settings = self.config.ahn
        x, positions = self._embed(tokens)
        layers = []
        for block in self.blocks:
            x, layer = block.prefill(x, positions, window=settings.window, sinks=settings.sinks)
            layers.append(layer)
        return self.logits(self.final_norm(x)), {"position": cache["position"] + tokens.shape[1], "layers": layers}

    def _stream(self, tokens, cache):
        settings = self.config.ahn
        dtype = jnp.dtype(self.config.compute_dtype)

        def step(carry, token):
            position, layers = carry
            x = jnp.take(self.embed.get_value(), token[:, None], axis=0).astype(dtype)
            new_layers = []
            for block, layer_cache in zip(self.blocks, layers):
                x, layer_cache = block.decode(x, position, layer_cache, window=settings.window, sinks=settings.sinks)
                new_layers.append(layer_cache)
            return (position + 1, new_layers), self.logits(self.final_norm(x))[:, 0]

        (position, layers), logits = jax.lax.scan(step, (cache["position"], cache["layers"]), tokens.T)
        return logits.transpose(1, 0, 2), {"position": position, "layers": layers}

    def init_cache(self, batch_size: int, max_len: int) -> dict:
        """The bounded decoding cache: its size depends on ``model.ahn.window``, not on ``max_len``."""
        del max_len
        dtype = jnp.dtype(self.config.compute_dtype)
        return {"position": jnp.zeros((), jnp.int32),
                "layers": [block.init_cache(batch_size, self.config.ahn.window, dtype) for block in self.blocks]}

    def train_window(self, batch: dict, length: int):
        """``(window, sinks)`` of this step: fixed, or drawn from ``window_choices`` keyed by ``batch["step"]``."""
        settings = self.config.ahn
        if not settings.random_window:
            return settings.window, settings.sinks
        windows, sinks, valid = window_choices(length)
        key = jax.random.fold_in(jax.random.key(0), batch.get("step", 0))
        window_key, sink_key = jax.random.split(key)
        row = jax.random.randint(window_key, (), 0, windows.shape[0])
        column = jax.random.categorical(sink_key, jnp.where(valid[row], 0.0, -jnp.inf))
        return windows[row], sinks[column]

    def loss(self, batch: dict):
        """Summed KL(teacher || student) over positions ``>= window`` (and ``loss_mask``), and their count.

        ``batch["teacher_hidden"]`` (``[B, T, D]``, optional) replaces the teacher's forward pass."""
        tokens = batch["inputs"]
        window, sinks = self.train_window(batch, tokens.shape[1])
        student = self.hidden(tokens, window=window, sinks=sinks)
        teacher = batch.get("teacher_hidden")
        teacher = jax.lax.stop_gradient(self.hidden(tokens) if teacher is None else teacher)
        weights = (jnp.arange(tokens.shape[1]) >= window)[None, :] & (batch["loss_mask"] > 0)
        weights = weights.astype(jnp.float32)
        kl = chunked_kl(student, teacher, self.head_matrix(), weights, chunk=self.config.ahn.loss_chunk,
                        shards=sequence_shards())
        return kl, jnp.sum(weights)

    def flops_per_token(self, seq_len: int) -> float:
        return ahn_flops_per_token(self.config, seq_len)


def with_mode(model: AHNModel, mode: str, length: int) -> AHNModel:
    """A copy of ``model`` that decodes (``generate``) and runs its forward as ``mode``, from the same weights:

    - ``ahn``: the model itself;
    - ``swa``: sliding window + sinks alone, the same window and sinks, every compressor's ``readout`` zeroed, so
      its memory term is exactly 0;
    - ``teacher``: full causal attention over up to ``length`` tokens: a window of ``length`` and no sinks, so no
      token is ever evicted, every compressor's state stays 0 and its read-out adds exactly 0.

    The copy holds its own parameters (the model is not changed)."""
    if mode not in MODES:
        raise ValueError(f"AHN mode {mode!r}: choose from {', '.join(MODES)}")
    if mode == "ahn":
        return model
    if length < 2:
        raise ValueError(f"length must be >= 2 (the longest row the teacher reads), got {length}")
    copy = nnx.clone(model)
    if mode == "swa":
        for block in copy.blocks:
            block.ahn.readout.set_value(jnp.zeros_like(block.ahn.readout.get_value()))
    else:
        settings = dataclasses.replace(model.config.ahn, window=length, sinks=0, random_window=False)
        copy.config = dataclasses.replace(model.config, ahn=settings)
    return copy


def ahn_flops_per_token(config: ModelConfig, seq_len: int, *, window: int | None = None,
                        sinks: int | None = None) -> float:
    """Forward FLOPs per token of the student at rows of ``seq_len``: per layer the attention over sinks + ring
    (``seqmodels.mixers.attention``), the compressor (``compressor_flops_per_token``) and the MLP ``6 D F``,
    plus the head ``2 D V``."""
    window = config.ahn.window if window is None else window
    sinks = config.ahn.sinks if sinks is None else sinks
    per_layer = (attention_flops(config, seq_len, window - sinks, sinks) + compressor_flops_per_token(config, seq_len)
                 + 6 * config.d_model * config.mlp_hidden)
    return len(config.mixers) * per_layer + 2 * config.d_model * config.vocab_size
