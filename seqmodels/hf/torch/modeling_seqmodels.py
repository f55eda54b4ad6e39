"""The exported seqmodels architectures as ``transformers`` models (pure PyTorch twins of ``seqmodels.models``):
the ``auto_map`` entry file of every ``model_type: seqmodels`` export.

    SeqmodelsForCausalLM                        the decoder LM over any list of mixers, and AHN (``lm``)
    SeqmodelsLoopedForSequenceClassification    the looped padded transformer (``looped``)

Where the twins differ from the JAX model, and why: the recurrent mixers run their recurrent form over
the prompt too (one state update per token; JAX trains with the chunked forms, equal within float32
round-off), chosen for being obviously the docstring's equations; a chunked form for long prompts is
not written yet. Attention scores and every recurrent state are float32 whatever the weights' dtype,
and in a bfloat16 export Atlas's Newton-Schulz also runs in float32 (JAX: ``model.compute_dtype``
operands with float32 accumulation).
"""

from __future__ import annotations

from .lm import SeqmodelsForCausalLM
from .looped import SeqmodelsLoopedForSequenceClassification

__all__ = ["SeqmodelsForCausalLM", "SeqmodelsLoopedForSequenceClassification"]
