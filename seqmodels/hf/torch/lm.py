"""The decoder LM (and AHN) as a ``transformers`` causal LM: the JAX ``seqmodels.models.lm``.

``SeqmodelsForCausalLM`` is the decoder LM over ``model.mixers`` (any hybrid list)::

    h_0 = Embed(tokens)
    h_l = h_{l-1} + Mixer_l(RMSNorm(h_{l-1}));  h_l = h_l + SwiGLU(RMSNorm(h_l))   (when model.mlp)
    logits = RMSNorm(h_L) W_out^T                                                   (W_out = Embed when tied)

``model.kind: ahn`` is the same causal LM with ``ahn.AHNBlock`` layers (``BLOCKS``): the frozen base's
attention over sinks + a sliding window, plus a compressor of the tokens that left it (decoding in
bounded memory).

Padded batches: ``attention_mask [B, T]`` (1 = token, 0 = padding, left or right; in ``generate`` the mask of
every column so far, of which the last ``T`` are this call's) gives each real token its position in its own
row, and every mixer reads and writes real tokens only (``layers.row_positions``), so each row's logits
are those of the row run alone. A padded position's logits are those of the last real token before it
in the call (zero before the first), so the last column of a right-padded prompt predicts the token after
its last real one. No packed documents.

Each layer's mixer (``mixers.MIXERS``) keeps its decoding state in its own dict; ``SeqmodelsCache``
holds one per layer, so ``generate`` prefills the prompt and then decodes one token per step from the cache.

Across ``transformers`` versions: the output field (and ``generate``'s keyword) that carries the cache is
``cache`` where ``CausalLMOutputWithPast`` has that field and ``past_key_values`` where it has the older
one (``CACHE_FIELD``, read from the class, not from a version number); ``forward`` and
``prepare_inputs_for_generation`` accept either name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .ahn import AHNBlock
from .configuration_seqmodels import SeqmodelsConfig
from .layers import RMSNorm, SwiGLU, mlp_hidden, row_positions
from .mixers import build_mixer

# the CausalLMOutputWithPast field (and generate's model keyword) that holds the cache in this transformers
CACHE_FIELD = next(name for name in ("cache", "past_key_values") if name in CausalLMOutputWithPast.__dataclass_fields__)


class Block(nn.Module):
    """Pre-norm residual block: a mixer, then (when ``model.mlp``) a SwiGLU MLP."""

    def __init__(self, mixer_name: str, model: dict):
        super().__init__()
        self.mixer_norm = RMSNorm(model["d_model"], model["norm_eps"])
        self.mixer = build_mixer(mixer_name, model)
        self.mlp_norm = RMSNorm(model["d_model"], model["norm_eps"]) if model["mlp"] else None
        self.mlp = SwiGLU(model["d_model"], mlp_hidden(model)) if model["mlp"] else None

    def forward(self, x, positions, cache=None):
        mixed, cache = self.mixer(self.mixer_norm(x), positions, cache)
        x = x + mixed
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x, cache


# model.kind -> the block of layer i, given its mixer name and the model section
BLOCKS = {"lm": lambda mixer_name, model: Block(mixer_name, model),
          "ahn": lambda mixer_name, model: AHNBlock(model)}


def build_block(mixer_name: str, model: dict) -> nn.Module:
    kind = model.get("kind", "lm")
    if kind not in BLOCKS:
        raise ValueError(f"model.kind {kind!r} has no PyTorch decoder blocks; exported kinds: {', '.join(BLOCKS)}")
    return BLOCKS[kind](mixer_name, model)


class SeqmodelsCache:
    """Decoding state of every layer (``layers[i]``: the mixer's dict), the columns seen so far (``seen``,
    padding included) and each row's real tokens so far (``next_position [B]``, None before the first call)."""

    def __init__(self, num_layers: int):
        self.layers = [{} for _ in range(num_layers)]
        self.seen = 0
        self.next_position = None


class SeqmodelsPreTrainedModel(PreTrainedModel):
    config_class = SeqmodelsConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model brings its own cache (SeqmodelsCache), made in prepare_inputs_for_generation

    def _init_weights(self, module):
        """Nothing to initialise: every parameter comes from the exported checkpoint."""


def check_plain_rows(attention_mask) -> None:
    if attention_mask is not None and not bool(torch.all(attention_mask != 0)):
        raise ValueError("attention_mask marks padding: the looped model takes plain rows only (its layout and "
                         "number of loops follow each row's length); run rows of different lengths one at a time")


def real_columns(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` bool: which of ``input_ids [B, T]`` are tokens; ``attention_mask [B, >= T]`` (its last ``T``
    columns), None: all."""
    if attention_mask is None:
        return torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    if attention_mask.ndim != 2 or attention_mask.shape[0] != input_ids.shape[0] or \
            attention_mask.shape[1] < input_ids.shape[1]:
        raise ValueError(f"attention_mask must be [batch, columns] with batch {input_ids.shape[0]} and at least "
                         f"{input_ids.shape[1]} columns (1 = token, 0 = padding), got {list(attention_mask.shape)}")
    return attention_mask[:, attention_mask.shape[1] - input_ids.shape[1]:] != 0


def carry_last_real(hidden: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``hidden [B, T, D]`` with each padded position given the last real position's before it (zero before the
    first)."""
    columns = torch.arange(real.shape[1], device=real.device).expand_as(real)
    last = torch.cummax(torch.where(real, columns, torch.full_like(columns, -1)), dim=1).values
    carried = torch.gather(hidden, 1, last.clamp_min(0)[..., None].expand_as(hidden))
    return torch.where((last >= 0)[..., None], carried, torch.zeros_like(carried))


class SeqmodelsModel(SeqmodelsPreTrainedModel):
    """The decoder body: embedding, the blocks of ``model.mixers``, the final norm."""

    def __init__(self, config: SeqmodelsConfig):
        super().__init__(config)
        model = config.model
        self.embed = nn.Embedding(model["vocab_size"], model["d_model"])
        self.blocks = nn.ModuleList([build_block(name, model) for name in model["mixers"]])
        self.final_norm = RMSNorm(model["d_model"], model["norm_eps"])
        self.post_init()

    def forward(self, input_ids: torch.Tensor, cache: SeqmodelsCache | None = None,
                real: torch.Tensor | None = None) -> torch.Tensor:
        """The normed hidden states ``[B, T, D]`` of ``input_ids`` (``real [B, T]``: which are tokens; None: all)."""
        real = real_columns(input_ids, None) if real is None else real
        start = None if cache is None else cache.next_position
        start = torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device) if start is None else start
        positions = row_positions(real, start)
        x = self.embed(input_ids)
        for i, block in enumerate(self.blocks):
            x, _ = block(x, positions, None if cache is None else cache.layers[i])
        if cache is not None:
            cache.seen += input_ids.shape[1]
            cache.next_position = start + real.sum(dim=1)
        return self.final_norm(x)


class SeqmodelsForCausalLM(SeqmodelsPreTrainedModel, GenerationMixin):
    def __init__(self, config: SeqmodelsConfig):
        super().__init__(config)
        model = config.model
        self.model = SeqmodelsModel(config)
        self.lm_head = None if model["tie_embeddings"] else nn.Linear(model["d_model"], model["vocab_size"],
                                                                      bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: SeqmodelsCache | None = None, past_key_values: SeqmodelsCache | None = None,
                use_cache: bool | None = None, labels=None, logits_to_keep: int = 0,
                **kwargs) -> CausalLMOutputWithPast:
        """Logits ``[B, T, vocab]`` (float32); with ``use_cache`` the cache after these tokens (in the output's
        ``CACHE_FIELD``). ``cache`` and ``past_key_values`` name the same argument (module docstring)."""
        cache = cache if cache is not None else past_key_values
        real = real_columns(input_ids, attention_mask)
        if use_cache and cache is None:
            cache = SeqmodelsCache(len(self.model.blocks))
        hidden = carry_last_real(self.model(input_ids, cache=cache, real=real), real)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        weight = self.model.embed.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden, weight.to(hidden.dtype)).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})

    def prepare_inputs_for_generation(self, input_ids, cache: SeqmodelsCache | None = None,
                                      past_key_values: SeqmodelsCache | None = None, attention_mask=None, **kwargs):
        """The prompt with a new cache on the first step, then only the tokens the cache has not seen (with the
        attention mask of every column: ``forward`` reads its last ones)."""
        cache = cache if cache is not None else past_key_values
        if cache is None:
            cache = SeqmodelsCache(len(self.model.blocks))
        return {"input_ids": input_ids[:, cache.seen:], "cache": cache, "use_cache": True,
                "attention_mask": attention_mask}
