"""Shared building blocks: parameters with logical axes, dense maps, norms, rotary, MLP, attention."""
