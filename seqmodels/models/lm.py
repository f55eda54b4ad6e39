"""Decoder language model assembled from a list of mixers (``model.mixers``).

    h_0 = Embed(tokens)
    h_l = h_{l-1} + Mixer_l(RMSNorm(h_{l-1}))          for each mixer in model.mixers
    h_l = h_l + SwiGLU(RMSNorm(h_l))                   (when model.mlp)
    logits = RMSNorm(h_L) @ W_out                       (W_out = Embed^T when tie_embeddings)

So ``model.mixers: "[swa, attention] * 4"`` is an 8-layer hybrid, and Transformer++ is
``[attention] * L``. Positions restart at every document of a packed row (from ``segment_ids``).
With ``model.scan_layers`` the repeated group of ``model.mixers`` runs as one scanned body over
stacked parameters (``stack.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from seqmodels.config import ModelConfig
from seqmodels.layers.common import param
from seqmodels.layers.mlp import SwiGLU
from seqmodels.layers.norms import RMSNorm
from seqmodels.mixers import build_mixer, check_mixer_names, mixer_flops_per_token
from seqmodels.models.stack import Group, repeat_period, scan_group, slice_group, stack_groups, unstack_sown
from seqmodels.sharding import constrain

# "full" keeps only each layer's input and recomputes everything else in the backward; "dots" keeps the
# outputs of matmuls without batch dimensions; "names" keeps the values named here (the projections, the
# mixer output, the short convolutions' outputs). "full" once kept the short convolutions' outputs too
# (1.1 GiB per chip for Atlas 350M on v5e-8), blamed for a TPU compiler abort whose cause was elsewhere
# (pallas_kernels/gated_delta_rule/tpu.py, benchmarks/results/tpu_aot/README.md).
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "names": jax.checkpoint_policies.save_only_these_names("query", "key", "value", "mixer_out", "short_conv"),
}


def document_positions(segment_ids: jax.Array) -> jax.Array:
    """Position of every token within its document: ``[B, T]`` ints restarting where the segment changes."""
    length = segment_ids.shape[1]
    index = jnp.arange(length, dtype=jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
    return index - first


class Block(nnx.Module):
    """Pre-norm residual block: a mixer, then (optionally) a SwiGLU MLP."""

    def __init__(self, mixer_name: str, config: ModelConfig, rngs: nnx.Rngs):
        self.mixer_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.mixer = build_mixer(mixer_name, config, rngs)
        self.mlp_norm = RMSNorm(config.d_model, eps=config.norm_eps) if config.mlp else None
        self.mlp = SwiGLU(config.d_model, config.mlp_hidden, rngs=rngs, std=config.init_std) if config.mlp else None

    def __call__(self, x, *, segment_ids=None, positions=None, cache=None):
        mixed, cache = self.mixer(self.mixer_norm(x), segment_ids=segment_ids, positions=positions, cache=cache)
        x = x + jax.ad_checkpoint.checkpoint_name(mixed, "mixer_out")
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "seq", "embed")), cache


def _run_block(block: Block, x, segment_ids, positions):
    return block(x, segment_ids=segment_ids, positions=positions)[0]


class LM(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        check_mixer_names(config.mixers)
        self.config = config
        self.embed = param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"), std=config.init_std)
        blocks = [Block(name, config, rngs) for name in config.mixers]
        if config.scan_layers:
            period = repeat_period(config.mixers)
            self.repeats = len(blocks) // period
            self.blocks = None
            self.stack = stack_groups([Group(blocks[r * period:(r + 1) * period]) for r in range(self.repeats)])
        else:
            self.blocks, self.stack = nnx.List(blocks), None
        self.final_norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = None if config.tie_embeddings else param(
            rngs, (config.d_model, config.vocab_size), ("embed", "vocab"), std=config.init_std)

    def __call__(self, tokens, *, segment_ids=None, positions=None, cache=None):
        """Logits ``[B, T, vocab]`` (float32) for ``tokens: [B, T]``, and the updated cache."""
        batch, length = tokens.shape
        if positions is None:
            if cache is not None:
                positions = cache["position"] + jnp.arange(length, dtype=jnp.int32)
                positions = jnp.broadcast_to(positions, (batch, length))
            elif segment_ids is not None:
                positions = document_positions(segment_ids)
            else:
                positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        dtype = jnp.dtype(self.config.compute_dtype)
        x = jnp.take(self.embed.get_value(), tokens, axis=0).astype(dtype)
        x = constrain(x, ("batch", "seq", "embed"))
        if self.stack is not None:
            return self._scanned(x, segment_ids, positions, cache)
        layer_caches = []
        for i, block in enumerate(self.blocks):
            if cache is not None:
                x, layer_cache = block(x, positions=positions, cache=cache["layers"][i])
                layer_caches.append(layer_cache)
            elif self.config.remat != "none":
                remat = nnx.remat(_run_block, policy=REMAT_POLICIES[self.config.remat])
                x = remat(block, x, segment_ids, positions)
            else:
                x = block(x, segment_ids=segment_ids, positions=positions)[0]
        return self._logits(x), self._advance(cache, length, layer_caches)

    def _scanned(self, x, segment_ids, positions, cache):
        remat = cache is None and self.config.remat != "none"
        x, (layer_caches, sown) = scan_group(self.stack, x, segment_ids=None if cache is not None else segment_ids,
                                             positions=positions, caches=None if cache is None else cache["layers"],
                                             remat=remat, remat_policy=REMAT_POLICIES.get(self.config.remat))
        sown = unstack_sown(sown, self.repeats, len(self.config.mixers) // self.repeats)
        if sown:  # the groups' diagnostics, in the unrolled layout (seqmodels.training.diagnostics)
            self.sow(nnx.Intermediate, "scanned_blocks", sown, capture_noop=True,
                     init_fn=lambda: None, reduce_fn=lambda _, new: new)
        return self._logits(x), self._advance(cache, x.shape[1], layer_caches)

    def _logits(self, x):
        x = self.final_norm(x)
        head = self.embed.get_value().T if self.head is None else self.head.get_value()
        logits = jnp.dot(x, head.astype(x.dtype), preferred_element_type=jnp.float32)
        return constrain(logits, ("batch", "seq", "vocab"))

    @staticmethod
    def _advance(cache, length, layer_caches):
        return None if cache is None else {"position": cache["position"] + length, "layers": layer_caches}

    def loss(self, batch: dict):
        """Summed next-token cross-entropy over ``batch["loss_mask"]`` and the number of loss tokens."""
        logits, _ = self(batch["inputs"], segment_ids=batch.get("segment_ids"), positions=batch.get("positions"))
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        mask = batch["loss_mask"].astype(jnp.float32)
        return jnp.sum(losses * mask), jnp.sum(mask)

    def init_cache(self, batch_size: int, max_len: int) -> dict:
        dtype = jnp.dtype(self.config.compute_dtype)
        if self.stack is None:
            layers = [block.mixer.init_cache(batch_size, max_len, dtype) for block in self.blocks]
        else:  # one cache per block of the group, stacked over the groups like the parameters
            per_group = [[block.mixer.init_cache(batch_size, max_len, dtype) for block in slice_group(self.stack, r).blocks]
                         for r in range(self.repeats)]
            layers = jax.tree.map(lambda *caches: jnp.stack(caches), *per_group)
        return {"position": jnp.zeros((), jnp.int32), "layers": layers}

    def flops_per_token(self, seq_len: int) -> float:
        return lm_flops_per_token(self.config, seq_len)


def lm_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token: every mixer (its registry formula), the MLPs (``6 D F``) and the head (``2 D V``)."""
    mixers = sum(mixer_flops_per_token(name, config, seq_len) for name in config.mixers)
    mlps = len(config.mixers) * 6 * config.d_model * config.mlp_hidden if config.mlp else 0
    return mixers + mlps + 2 * config.d_model * config.vocab_size


@nnx.jit(static_argnames=("max_new_tokens", "temperature"))
def _generate(model, prompt, rng, *, max_new_tokens: int, temperature: float):
    batch, prompt_len = prompt.shape
    cache = model.init_cache(batch, prompt_len + max_new_tokens)
    logits, cache = model(prompt, cache=cache)

    def pick(logits, key):
        if temperature == 0.0:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)

    def step(carry, key):
        token, cache = carry
        logits, cache = model(token[:, None], cache=cache)
        nxt = pick(logits[:, -1], key)
        return (nxt, cache), (nxt, logits[:, -1])

    keys = jax.random.split(rng, max_new_tokens)
    first = pick(logits[:, -1], keys[0])
    (_, _), (rest, step_logits) = jax.lax.scan(step, (first, cache), keys[1:])
    tokens = jnp.concatenate([prompt, first[:, None], rest.T], axis=1)
    all_logits = jnp.concatenate([logits, step_logits.transpose(1, 0, 2)], axis=1)
    return tokens, all_logits


def generate(model, prompt, max_new_tokens: int, *, temperature: float = 0.0, rng=None):
    """Decode ``max_new_tokens`` after ``prompt: [B, P]`` with the cache; returns ``(tokens, logits)``.

    ``tokens`` is ``[B, P + max_new_tokens]``; ``logits[:, t]`` are the logits that predicted token
    ``t + 1`` (the prompt's from the prefill, then one per decoding step). Greedy when temperature is 0.
    """
    prompt = jnp.asarray(prompt)
    if prompt.ndim != 2 or not jnp.issubdtype(prompt.dtype, jnp.integer):
        raise ValueError(f"prompt must be an integer array [batch, length], got {prompt.dtype}{list(prompt.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    total = prompt.shape[1] + max_new_tokens
    if total > model.config.max_seq_len:
        raise ValueError(f"prompt length {prompt.shape[1]} + max_new_tokens {max_new_tokens} = {total} exceeds "
                         f"model.max_seq_len={model.config.max_seq_len}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    rng = jax.random.key(0) if rng is None else rng
    return _generate(model, prompt.astype(jnp.int32), rng, max_new_tokens=max_new_tokens,
                     temperature=float(temperature))
