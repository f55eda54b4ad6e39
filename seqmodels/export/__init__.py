"""PyTorch export of every architecture: the JAX -> PyTorch weight map (``weight_map``), the writer
(``writer``), and ``torch/``: the pure PyTorch + transformers modules copied into each export and
loaded by ``transformers`` with ``trust_remote_code=True``."""
