"""The held-out sample that evaluation reads: held-out documents in a seeded random order, one row each at most.

Reading held-out documents in corpus order makes the evaluation a sample of the first few documents
(one long document can fill every row). Instead, with ``N`` held-out documents and seed
``s = data.heldout_seed``::

    order    = a permutation of 0..N-1 drawn from numpy's default_rng([s, SALT])   (sample_order)
    elements = frame(document[order[0]]), frame(document[order[1]]), ...           ([open] + tokens + [close])
    each element cut to its first seq_len + 1 tokens                                (at most one row of it)
    packed into rows of seq_len + 1 tokens as training packs them (packing.py), batched, the last batch padded

so ``max_batches x batch_size`` rows hold at least that many distinct documents, drawn without
replacement, and positions are positions within the document (every piece starts at its document's
start unless a row boundary splits it). A pass long enough reads every held-out document exactly once.
Each batch also carries ``documents`` int32 ``[batch_size, seq_len]``: the held-out index of the
document each target token belongs to (-1 for padding), which the bootstrap over documents uses.
"""

from __future__ import annotations

from collections.abc import Callable

import grain
import numpy as np

from seqmodels.data.packing import heldout_batches

SALT = 0x5E9D0C  # keeps the sample's permutation apart from other uses of the same seed


def sample_order(count: int, seed: int) -> np.ndarray:
    """The order in which ``count`` held-out documents are drawn for seed ``seed`` (a permutation)."""
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return np.random.default_rng([seed, SALT]).permutation(count)


def sampled_heldout_batches(documents, frame: Callable[[object], dict], *, seq_len: int, batch_size: int,
                            max_batches: int, seed: int) -> list[dict]:
    """The batches of the module docstring over ``documents`` (indexable), ``frame(document) -> element``."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be an int >= 1, got {seq_len!r}")
    row = seq_len + 1
    needed = batch_size * max_batches * row
    elements, owners, total = [], [], 0
    for index in sample_order(len(documents), seed):
        element = frame(documents[int(index)])
        element = {key: value[:row] for key, value in element.items()}
        if not element["tokens"].size:
            continue
        elements.append(element)
        owners.append(np.full(element["tokens"].size, int(index), np.int32))
        total += element["tokens"].size
        if total >= needed:
            break
    batches = heldout_batches(grain.MapDataset.source(elements).to_iter_dataset(), seq_len=seq_len,
                              batch_size=batch_size, max_batches=max_batches)
    stream = np.concatenate(owners) if owners else np.zeros(0, np.int32)
    for number, batch in enumerate(batches):
        start = number * batch_size * row
        owner = np.full(batch_size * row, -1, np.int32)
        piece = stream[start:start + batch_size * row]
        owner[:piece.size] = piece
        owner = owner.reshape(batch_size, row)[:, 1:]  # the document of each target token
        batch["documents"] = np.where(batch["loss_mask"] > 0, owner, -1).astype(np.int32)
    return batches
