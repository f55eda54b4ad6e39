"""The looped padded transformer (``model.kind: looped``) as a ``transformers`` classifier: the JAX
``seqmodels.models.looped``.

``SeqmodelsLoopedForSequenceClassification``: ``[BOS] w [CLS]`` -> ``[BOS] w [PAD] x P(N) [CLS]``, prelude,
one shared block ``loops(N)`` times (re-injecting the prelude output), coda, and the read-out at [CLS];
its ``logits`` are ``(<reject>, <accept>)`` (``id2label``; the ids of ``special_tokens``, the JAX
side's own module copied into the export) and ``vocab_logits`` the whole head's row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from .configuration_seqmodels import SeqmodelsConfig
from .layers import RMSNorm, sinusoidal_positions
from .lm import Block, SeqmodelsPreTrainedModel, check_plain_rows
from .special_tokens import ACCEPT_ID, REJECT_ID


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
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)  # plain rows
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
        check_plain_rows(attention_mask)
        readout = self.model(input_ids)
        weight = self.model.embed.weight if self.lm_head is None else self.lm_head.weight
        vocab_logits = F.linear(readout, weight.to(readout.dtype)).float()
        logits = vocab_logits[:, [REJECT_ID, ACCEPT_ID]]
        loss = None if labels is None else F.cross_entropy(logits, labels)
        output = SequenceClassifierOutput(loss=loss, logits=logits)
        output["vocab_logits"] = vocab_logits
        return output
