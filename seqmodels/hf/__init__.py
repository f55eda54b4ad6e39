"""Every checkpoint format, one module each that reads and writes it (``formats``: Llama / Qwen2 safetensors
in ``llama``, the ``model_type: seqmodels`` remote-code format in ``remote_code``, GGUF in through ``gguf``
and ``python -m seqmodels.hf.convert_gguf``); ``export`` writes a model or a run's checkpoint in the
first format that takes it (``export.py``), ``load_pretrained`` reads any of them back, and ``base``
resolves a model whose architecture and weights come from another checkpoint (``model.init_from``,
``model.ahn.base``). ``torch/`` holds the PyTorch modules copied into every ``model_type: seqmodels`` export.

Names are imported on first use (PEP 562), so ``seqmodels.data`` can use the tokenizer without
importing the model code that ``load_pretrained`` needs.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"HFFormatError": "errors", "HFTokenizer": "tokenizer", "load_tokenizer": "tokenizer",
            "load_model_config": "formats", "load_pretrained": "formats", "load_pretrained_params": "formats",
            "resolve_base": "base", "start_params": "base"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'seqmodels.hf' has no attribute {name!r}")
    return getattr(importlib.import_module(f"seqmodels.hf.{_EXPORTS[name]}"), name)
