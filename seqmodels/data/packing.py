"""Packing a stream of token sequences into fixed-length rows, and rows into training batches.

Every source (text corpora, synthetic tasks) produces a stream of *elements*
``{"tokens": int32[n], "loss_mask": float32[n]}`` where ``loss_mask[i]`` weighs the loss of
predicting ``tokens[i]`` from the tokens before it in the same element (a text document:
``[BOS, bytes..., EOS]`` with mask ``[0, 1, ..., 1]``; associative recall: 1 on answers only).

``PackedRowsIterDataset`` concatenates elements into rows of ``R = seq_len + 1`` tokens: an element
that does not fit continues at the start of the next row, and only the end of a finite stream
leaves padding. Each row carries ``segment_ids`` (1, 2, ... for the pieces of elements in the row,
0 for padding) and ``positions`` (0, 1, ... within each piece; a piece continued from the previous
row restarts at 0, because the model attends within a row only). ``shift_row`` turns a row into a
training example of ``seq_len`` positions::

    inputs[t]      = tokens[t]               targets[t]   = tokens[t + 1]
    segment_ids[t] = segment_ids_row[t]      positions[t] = positions_row[t]
    loss_mask[t]   = row_loss_mask[t + 1] * [seg[t + 1] == seg[t] != 0]

so the loss is zero where the target belongs to another element (a document boundary) or to
padding. The iterator's state is ``{"parent": <state before the current element>, "offset": k}``
(plain ints, JSON-safe): restoring re-reads the current element and skips its first ``k`` tokens.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np

FIELDS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")


def check_element(element: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a stream element; return its ``(tokens int32[n], loss_mask float32[n])``."""
    if not isinstance(element, dict) or set(element) != {"tokens", "loss_mask"}:
        keys = sorted(element) if isinstance(element, dict) else type(element).__name__
        raise ValueError(f"a packed element must be a dict with keys ['loss_mask', 'tokens'], got {keys}")
    tokens, loss_mask = np.asarray(element["tokens"]), np.asarray(element["loss_mask"])
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"element['tokens'] must be a 1-D integer array [n], got shape "
                         f"{tokens.shape}, dtype {tokens.dtype}")
    if loss_mask.shape != tokens.shape:
        raise ValueError(f"element['loss_mask'] must have the shape of element['tokens'] "
                         f"{tokens.shape}, got {loss_mask.shape}")
    return tokens.astype(np.int32, copy=False), loss_mask.astype(np.float32, copy=False)


class _PackedRowsIterator(grain.DatasetIterator):
    """Fills rows from the parent; holds at most one partly consumed element."""

    def __init__(self, parent: grain.DatasetIterator, row_length: int):
        super().__init__(parent)
        self._row_length = row_length
        self._current: tuple[np.ndarray, np.ndarray] | None = None
        self._state_before_current: dict | None = None
        self._offset = 0  # tokens of the current element already placed in rows

    def _pull(self) -> bool:
        """Make the next non-empty parent element current; False at the end of the stream."""
        while True:
            state = self._parent.get_state()
            try:
                tokens, loss_mask = check_element(next(self._parent))
            except StopIteration:
                return False
            if tokens.size:
                self._current, self._state_before_current, self._offset = (tokens, loss_mask), state, 0
                return True

    def __next__(self) -> dict[str, np.ndarray]:
        length = self._row_length
        row = {"tokens": np.zeros(length, np.int32), "loss_mask": np.zeros(length, np.float32),
               "segment_ids": np.zeros(length, np.int32), "positions": np.zeros(length, np.int32)}
        filled, segment = 0, 0
        while filled < length:
            if self._current is None and not self._pull():
                break
            tokens, loss_mask = self._current
            take = min(length - filled, tokens.size - self._offset)
            piece = slice(self._offset, self._offset + take)
            segment += 1
            row["tokens"][filled:filled + take] = tokens[piece]
            row["loss_mask"][filled:filled + take] = loss_mask[piece]
            row["segment_ids"][filled:filled + take] = segment
            row["positions"][filled:filled + take] = np.arange(take, dtype=np.int32)
            filled += take
            self._offset += take
            if self._offset == tokens.size:
                self._current = None
        if filled == 0:
            raise StopIteration
        return row

    def get_state(self) -> dict[str, Any]:
        if self._current is None:
            return {"parent": self._parent.get_state(), "offset": 0}
        return {"parent": self._state_before_current, "offset": self._offset}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._current = None
        offset = int(state["offset"])
        if offset:
            if not self._pull():
                raise ValueError(f"cannot restore packing state {state}: the parent stream ended")
            self._offset = offset


class PackedRowsIterDataset(grain.IterDataset):
    """Rows of ``row_length`` tokens packed from a stream of ``{"tokens", "loss_mask"}`` elements."""

    def __init__(self, parent: grain.IterDataset, *, row_length: int):
        if not isinstance(row_length, int) or row_length < 2:
            raise ValueError(f"row_length must be an int >= 2 (seq_len + 1), got {row_length!r}")
        super().__init__(parent)
        self._row_length = row_length

    def __iter__(self) -> _PackedRowsIterator:
        return _PackedRowsIterator(self._parent.__iter__(), self._row_length)

    def __str__(self) -> str:
        return f"PackedRowsIterDataset(row_length={self._row_length})"


def shift_row(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A packed row of ``seq_len + 1`` tokens -> one example of ``seq_len`` positions (see module doc)."""
    segment_ids = row["segment_ids"]
    same_segment = (segment_ids[1:] == segment_ids[:-1]) & (segment_ids[:-1] != 0)
    return {
        "inputs": row["tokens"][:-1],
        "targets": row["tokens"][1:],
        "segment_ids": segment_ids[:-1],
        "positions": row["positions"][:-1],
        "loss_mask": (row["loss_mask"][1:] * same_segment).astype(np.float32),
    }


def pack_examples(stream: grain.IterDataset, *, seq_len: int) -> grain.IterDataset:
    """Examples (``FIELDS``, each ``[seq_len]``) packed from a stream of elements."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be an int >= 1, got {seq_len!r}")
    return PackedRowsIterDataset(stream, row_length=seq_len + 1).map(shift_row)


def pack_and_batch(stream: grain.IterDataset, *, seq_len: int, batch_size: int,
                   drop_remainder: bool = True) -> grain.IterDataset:
    """Batches ``{field: [batch_size, seq_len]}`` packed from a stream of elements."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return pack_examples(stream, seq_len=seq_len).batch(batch_size, drop_remainder=drop_remainder)


def pad_batch(batch: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """``batch`` with all-zero rows appended up to ``batch_size`` rows (loss_mask 0 on them)."""
    rows = batch["inputs"].shape[0]
    if rows > batch_size:
        raise ValueError(f"batch has {rows} rows, more than batch_size={batch_size}")
    return {key: np.concatenate([value, np.zeros((batch_size - rows, *value.shape[1:]), value.dtype)])
            for key, value in batch.items()}


def heldout_batches(stream: grain.IterDataset, *, seq_len: int, batch_size: int, max_batches: int) -> list:
    """The first ``max_batches`` packed batches of a held-out stream, the last one padded to ``batch_size``
    rows (``pad_batch``), so that evaluation sees every document and a fixed batch shape."""
    result = []
    for batch in pack_and_batch(stream, seq_len=seq_len, batch_size=batch_size, drop_remainder=False):
        result.append(pad_batch(batch, batch_size))
        if len(result) == max_batches:
            break
    return result
