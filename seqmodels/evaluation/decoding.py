"""Greedy continuations of equal-length prompts, decoded in batches of one shape."""

from __future__ import annotations

import numpy as np

from seqmodels.models import generate


def greedy_continuations(model, prompts: np.ndarray, max_new_tokens: int, batch_size: int) -> np.ndarray:
    """prompts [N, T] -> [N, max_new_tokens]: the tokens ``generate`` decodes after each (temperature 0).

    The last batch is padded with copies of its last prompt, so every call has one shape (one compilation).
    """
    if prompts.ndim != 2 or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty [N, T] array, got shape {prompts.shape}")
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}")
    continuations = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        rows = len(batch)
        if rows < batch_size:
            batch = np.concatenate([batch, np.repeat(batch[-1:], batch_size - rows, axis=0)])
        tokens, _ = generate(model, batch, max_new_tokens)
        continuations.append(np.asarray(tokens)[:rows, prompts.shape[1]:])
    return np.concatenate(continuations)
