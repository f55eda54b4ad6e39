"""Every checkpoint format, one module each that reads and writes it (``formats``: Llama / Qwen2 safetensors
in ``llama``, the ``model_type: seqmodels`` remote-code format in ``remote_code``, GGUF in through ``gguf``
and ``python -m seqmodels.hf.convert_gguf``); ``export`` writes a model or a run's checkpoint in the
first format that takes it (``export.py``), ``load_pretrained`` reads any of them back, and ``base``
resolves a model whose architecture and weights come from another checkpoint (``model.init_from``,
``model.ahn.base``). ``torch/`` holds the PyTorch modules copied into every ``model_type: seqmodels`` export.

Names are imported on first use (PEP 562), so importing the package does not import the model code that
``load_pretrained`` needs. The tokenizer of a directory (``load_tokenizer``) lives with the data pipeline,
which uses it for ``data.tokenizer: hf:DIR``, and ``HFFormatError`` in ``seqmodels.errors``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"HFFormatError": "seqmodels.errors", "HFTokenizer": "seqmodels.data.hf_tokenizer",
            "load_tokenizer": "seqmodels.data.hf_tokenizer", "load_model_config": "seqmodels.hf.formats",
            "load_pretrained": "seqmodels.hf.formats", "load_pretrained_params": "seqmodels.hf.formats",
            "resolve_base": "seqmodels.hf.base", "start_params": "seqmodels.hf.base"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'seqmodels.hf' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
