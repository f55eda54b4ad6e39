"""The exported seqmodels architectures as ``transformers`` models (pure PyTorch; the JAX ``seqmodels.models``).

``SeqmodelsForCausalLM`` is the decoder LM over ``model.mixers`` (any hybrid list)::

    h_0 = Embed(tokens)
    h_l = h_{l-1} + Mixer_l(RMSNorm(h_{l-1}));  h_l = h_l + SwiGLU(RMSNorm(h_l))   (when model.mlp)
    logits = RMSNorm(h_L) W_out^T                                                   (W_out = Embed when tied)

``model.kind: ahn`` is the same causal LM with ``ahn_seqmodels.AHNBlock`` layers: the frozen base's
attention over sinks + a sliding window, plus a compressor of the tokens that left it (decoding in
bounded memory).

``SeqmodelsLoopedForSequenceClassification`` is the looped padded transformer (``model.kind: looped``):
``[BOS] w [CLS]`` -> ``[BOS] w [PAD] x P(N) [CLS]``, prelude, one shared block ``loops(N)`` times
(re-injecting the prelude output), coda, and the read-out at [CLS]; its ``logits`` are
``(<reject>, <accept>)`` (``id2label``) and ``vocab_logits`` the whole head's row.

Rows are plain (no padding, no packed documents). Each mixer module (``MIXERS``) takes
``(x [B, T, D], positions [T], cache)`` and returns ``(y, cache)``; ``cache`` is None (no decoding)
or the layer's dict, empty before the first token and updated in place. ``SeqmodelsCache`` holds one
per layer, so ``generate`` prefills the prompt and then decodes one token per step from the cache.

Where this differs from the JAX model, and why: the recurrent mixers run their recurrent form over
the prompt too (one state update per token; JAX trains with the chunked forms, equal within float32
round-off), chosen for being obviously the docstring's equations; a chunked form for long prompts is
not written yet. Attention scores and every recurrent state are float32 whatever the weights' dtype,
and in a bfloat16 export Atlas's Newton-Schulz also runs in float32 (JAX: ``model.compute_dtype``
operands with float32 accumulation).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutput

from .ahn_seqmodels import AHNBlock
from .atlas_seqmodels import ATLAS_MIXERS
from .attention_seqmodels import Attention
from .configuration_seqmodels import SeqmodelsConfig
from .layers_seqmodels import RMSNorm, SwiGLU, mlp_hidden, sinusoidal_positions
from .recurrent_seqmodels import RECURRENT_MIXERS

MIXERS = {
    "attention": lambda model: Attention(model, window=None, num_sinks=0),
    "swa": lambda model: Attention(model, window=model["swa"]["window"], num_sinks=model["swa"]["num_sinks"]),
    **RECURRENT_MIXERS,
    **ATLAS_MIXERS,
}

REJECT_ID, ACCEPT_ID = 3, 4  # seqmodels.special_tokens: the looped model's labels


def build_mixer(name: str, model: dict) -> nn.Module:
    if name not in MIXERS:
        raise ValueError(f"mixer {name!r} has no PyTorch module; exported mixers: {', '.join(sorted(MIXERS))}")
    return MIXERS[name](model)


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


def _check_plain_rows(attention_mask) -> None:
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
        _check_plain_rows(attention_mask)
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
        _check_plain_rows(attention_mask)
        if cache is None:
            cache = SeqmodelsCache(len(self.model.blocks))
        return {"input_ids": input_ids[:, cache.seen:], "cache": cache, "use_cache": True}


def num_loops(looped: dict, length: int) -> int:
    """``loops(N) = max(1, ceil(c log2 N) + d)`` (log schedule; N = 0 counts as 1), else ``fixed_loops``."""
    if looped["loop_schedule"] == "fixed":
        return looped["fixed_loops"]
    return max(1, math.ceil(looped["loops_scale"] * math.log2(max(length, 1))) + looped["loops_offset"])


def num_padding(looped: dict, length: int) -> int:
    """``P(N) = ceil(a N^e)`` padding positions before [CLS] (0 when a = 0)."""
    if looped["padding_scale"] == 0:
        return 0
    return math.ceil(looped["padding_scale"] * max(length, 0) ** looped["padding_exponent"])


class SeqmodelsLoopedModel(SeqmodelsPreTrainedModel):
    """The looped padded transformer's body (module docstring): hidden states over the padded layout."""

    def __init__(self, config: SeqmodelsConfig):
        super().__init__(config)
        model = config.model
        looped = model["looped"]
        blocks = {**model, "attention": {**model["attention"], "causal": looped["attention"] == "causal"}}
        self.embed = nn.Embedding(model["vocab_size"], model["d_model"])
        self.pad_embedding = nn.Parameter(torch.zeros(model["d_model"]))

        def make(count):
            return nn.ModuleList([Block(looped["mixer"], blocks) for _ in range(count)])

        self.prelude = make(looped["prelude_layers"])
        self.blocks = make(1 if looped["share_weights"] else looped["fixed_loops"])
        self.coda = make(looped["coda_layers"])
        self.final_norm = RMSNorm(model["d_model"], model["norm_eps"])
        self.post_init()

    def _embed_padded(self, input_ids: torch.Tensor) -> torch.Tensor:
        model, looped = self.config.model, self.config.model["looped"]
        length = input_ids.shape[1] - 2
        padding = num_padding(looped, length)
        x = self.embed(input_ids)
        pads = self.pad_embedding.to(x.dtype).expand(x.shape[0], padding, -1)
        x = torch.cat([x[:, :length + 1], pads, x[:, length + 1:]], dim=1)
        if looped["positions"] == "rope+sinusoidal":
            positions = torch.arange(x.shape[1], device=x.device)
            features = sinusoidal_positions(positions, model["d_model"], model["attention"]["rope_theta"])
            x = (x.float() + math.sqrt(2.0) * model["init_std"] * features).to(x.dtype)
        return x

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [B, N + 2]`` = ``[BOS] w [CLS]`` -> the normed hidden state at [CLS] ``[B, D]``."""
        looped = self.config.model["looped"]
        x = self._embed_padded(input_ids)
        positions = torch.arange(x.shape[1], device=x.device)
        for block in self.prelude:
            x = block(x, positions)[0]
        inject = x
        x = torch.zeros_like(x) if looped["reinject"] else x
        for i in range(num_loops(looped, input_ids.shape[1] - 2)):
            block = self.blocks[0 if looped["share_weights"] else i]
            x = block(x + inject if looped["reinject"] else x, positions)[0]
        for block in self.coda:
            x = block(x, positions)[0]
        return self.final_norm(x[:, -1])


class SeqmodelsLoopedForSequenceClassification(SeqmodelsPreTrainedModel):
    """Accept / reject of ``[BOS] w [CLS]`` rows: ``logits [B, 2]`` = the head's ``(<reject>, <accept>)`` entries."""

    def __init__(self, config: SeqmodelsConfig):
        super().__init__(config)
        model = config.model
        self.model = SeqmodelsLoopedModel(config)
        self.lm_head = None if model["tie_embeddings"] else nn.Linear(model["d_model"], model["vocab_size"],
                                                                      bias=False)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels=None,
                **kwargs) -> SequenceClassifierOutput:
        _check_plain_rows(attention_mask)
        readout = self.model(input_ids)
        weight = self.model.embed.weight if self.lm_head is None else self.lm_head.weight
        vocab_logits = F.linear(readout, weight.to(readout.dtype)).float()
        logits = vocab_logits[:, [REJECT_ID, ACCEPT_ID]]
        loss = None if labels is None else F.cross_entropy(logits, labels)
        output = SequenceClassifierOutput(loss=loss, logits=logits)
        output["vocab_logits"] = vocab_logits
        return output
