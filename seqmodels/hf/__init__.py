"""Hugging Face interop: Llama / Qwen2 checkpoints in (``load_pretrained``, ``load_tokenizer``, GGUF
conversion with ``python -m seqmodels.hf.convert_gguf``), every architecture out (``export.py``: Transformer++
as Llama / Qwen2, the rest as ``model_type: seqmodels`` with ``seqmodels.export``'s PyTorch modules), and
those exports back in (``load_pretrained``).

Names are imported on first use (PEP 562), so ``seqmodels.data`` can use the tokenizer without
importing the model code that ``load_pretrained`` needs.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"HFFormatError": "errors", "HFTokenizer": "tokenizer", "load_tokenizer": "tokenizer",
            "load_model_config": "load", "load_pretrained": "load", "load_pretrained_params": "load",
            "resolve_init_from": "init_from"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'seqmodels.hf' has no attribute {name!r}")
    return getattr(importlib.import_module(f"seqmodels.hf.{_EXPORTS[name]}"), name)
