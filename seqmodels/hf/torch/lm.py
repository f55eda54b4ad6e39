"""The decoder LM (and AHN) as a ``transformers`` causal LM: the JAX ``seqmodels.models.lm``.

``SeqmodelsForCausalLM`` is the decoder LM over ``model.mixers`` (any hybrid list)::

    h_0 = Embed(tokens)
    h_l = h_{l-1} + Mixer_l(RMSNorm(h_{l-1}));  h_l = h_l + SwiGLU(RMSNorm(h_l))   (when model.mlp)
    logits = RMSNorm(h_L) W_out^T                                                   (W_out = Embed when tied)

``model.kind: ahn`` is the same causal LM with ``ahn.AHNBlock`` layers (``BLOCKS``): the frozen base's
attention over sinks + a sliding window, plus a compressor of the tokens that left it (decoding in
bounded memory).

Rows are plain (no padding, no packed documents). Each layer's mixer (``mixers.MIXERS``) keeps its
decoding state in its own dict; ``SeqmodelsCache`` holds one per layer, so ``generate`` prefills the
prompt and then decodes one token per step from the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .ahn import AHNBlock
from .configuration_seqmodels import SeqmodelsConfig
from .layers import RMSNorm, SwiGLU, mlp_hidden
from .mixers import build_mixer


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
    """Decoding state of every layer (``layers[i]``: the mixer's dict) and the tokens seen so far."""

    def __init__(self, num_layers: int):
        self.layers = [{} for _ in range(num_layers)]
        self.seen = 0


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
        raise ValueError("attention_mask marks padding: the exported seqmodels modules take plain rows only "
                         "(every row as long as the batch); run rows of different lengths one at a time")


class SeqmodelsModel(SeqmodelsPreTrainedModel):
    """The decoder body: embedding, the blocks of ``model.mixers``, the final norm."""

    def __init__(self, config: SeqmodelsConfig):
        super().__init__(config)
        model = config.model
        self.embed = nn.Embedding(model["vocab_size"], model["d_model"])
        self.blocks = nn.ModuleList([build_block(name, model) for name in model["mixers"]])
        self.final_norm = RMSNorm(model["d_model"], model["norm_eps"])
        self.post_init()

    def forward(self, input_ids: torch.Tensor, cache: SeqmodelsCache | None = None) -> torch.Tensor:
        start = 0 if cache is None else cache.seen
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids)
        for i, block in enumerate(self.blocks):
            x, _ = block(x, positions, None if cache is None else cache.layers[i])
        if cache is not None:
            cache.seen += input_ids.shape[1]
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
                cache: SeqmodelsCache | None = None, use_cache: bool | None = None, labels=None,
                logits_to_keep: int = 0, **kwargs) -> CausalLMOutputWithPast:
        """Logits ``[B, T, vocab]`` (float32); with ``use_cache`` the cache after these tokens."""
        check_plain_rows(attention_mask)
        if use_cache and cache is None:
            cache = SeqmodelsCache(len(self.model.blocks))
        hidden = self.model(input_ids, cache=cache)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        weight = self.model.embed.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden, weight.to(hidden.dtype)).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def prepare_inputs_for_generation(self, input_ids, cache: SeqmodelsCache | None = None, attention_mask=None,
                                      **kwargs):
        """The prompt with a new cache on the first step, then only the tokens the cache has not seen."""
        check_plain_rows(attention_mask)
        if cache is None:
            cache = SeqmodelsCache(len(self.model.blocks))
        return {"input_ids": input_ids[:, cache.seen:], "cache": cache, "use_cache": True}
