"""``SeqmodelsConfig``: the Hugging Face config of an exported seqmodels architecture (``model_type: seqmodels``).

``model`` is the run's resolved model section (the JAX ``ModelConfig`` as a nested dict: ``mixers``,
``d_model``, ``num_heads``, the mixers' sections ``attention``, ``swa``, ``mamba2``, ``longhorn``,
``deltanet``, ``muonssm``, ``atlas``, ``looped``, ...): the modules read every setting from it.
The usual Hugging Face fields (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``tie_word_embeddings``) are derived from it.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class SeqmodelsConfig(PretrainedConfig):
    model_type = "seqmodels"

    def __init__(self, model: dict | None = None, **kwargs):
        self.model = model or {}
        if self.model:
            kwargs.setdefault("vocab_size", self.model["vocab_size"])
            kwargs.setdefault("hidden_size", self.model["d_model"])
            kwargs.setdefault("num_attention_heads", self.model["num_heads"])
            kwargs.setdefault("num_hidden_layers", len(self.model["mixers"]))
            kwargs.setdefault("max_position_embeddings", self.model["max_seq_len"])
            kwargs["tie_word_embeddings"] = self.model["tie_embeddings"]
        super().__init__(**kwargs)
