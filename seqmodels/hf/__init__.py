"""Hugging Face interop: Llama / Qwen2 checkpoints in (``load_pretrained``, ``load_tokenizer``, GGUF
conversion with ``python -m seqmodels.hf.convert_gguf``) and Transformer++ out (``export.py``)."""

from seqmodels.hf.errors import HFFormatError
from seqmodels.hf.load import load_model_config, load_pretrained, load_pretrained_params
from seqmodels.hf.tokenizer import HFTokenizer, load_tokenizer

__all__ = ["HFFormatError", "HFTokenizer", "load_model_config", "load_pretrained", "load_pretrained_params",
           "load_tokenizer"]
