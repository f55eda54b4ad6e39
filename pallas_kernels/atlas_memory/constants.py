"""Constants of the Atlas memory that its PyTorch twin shares (plain Python: copied into every export).

``NORM_EPS``: the epsilon of the deep memory's LayerNorm, ``LN(o) = (o - mean(o)) / sqrt(var(o) + eps)``;
1e-5 is ``torch.nn.LayerNorm``'s default, which titans-pytorch uses.
"""

NORM_EPS = 1e-5
