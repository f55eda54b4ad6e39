"""CFL recognition examples as token rows: the vocabulary, the row of one labelled string, evaluation sets.

One labelled string ``w`` of ``language`` is the element ``[BOS_language] w_1 .. w_N [CLS] [LABEL]``
with ``LABEL`` = ``<accept>`` or ``<reject>`` and a loss only on ``LABEL``; one element fills the
front of one row (the rest is empty: token 0, segment 0) and is shifted
like a packed row (``packing.shift_row``, but the label is never an input), so a batch has the usual
fields::

    inputs      [BOS] w_1 .. w_N [CLS]  0 ...         (N + 2 tokens, then empty)
    targets     w_1 .. w_N [CLS] [LABEL] 0 ...        (the label is the target at the [CLS] position)
    loss_mask   0 ... 0 1 0 ...                       (1 at the [CLS] position only)
    segment_ids 1 ... 1 0 ...   positions 0 1 ... N+1 0 ...

A language model can train on these rows as they are (predict the token after [CLS]); the looped
model reads N from the segment, inserts its padding before [CLS] and reads out at [CLS].
Each language has its own [BOS] token, so one model can learn several languages.
"""

from __future__ import annotations

import numpy as np

from seqmodels.data.cfl.languages import LANGUAGES, check_language, sample
from seqmodels.special_tokens import ACCEPT_ID, CFL_FIXED_IDS, CLS_ID, REJECT_ID

BOS_IDS = {name: CFL_FIXED_IDS + i for i, name in enumerate(LANGUAGES)}
SYMBOLS = "()[]ab#cd01&|!"
SYMBOL_IDS = {symbol: CFL_FIXED_IDS + len(BOS_IDS) + i for i, symbol in enumerate(SYMBOLS)}
VOCAB_SIZE = CFL_FIXED_IDS + len(BOS_IDS) + len(SYMBOLS)


def encode(language: str, text: str) -> np.ndarray:
    """``[BOS_language] w_1 .. w_N [CLS]`` as int32 ids ``[N + 2]``."""
    check_language(language)
    unknown = sorted(set(text) - set(LANGUAGES[language].alphabet))
    if unknown:
        raise ValueError(f"text has symbols {unknown} outside the {language} alphabet "
                         f"{LANGUAGES[language].alphabet!r}")
    return np.array([BOS_IDS[language], *(SYMBOL_IDS[s] for s in text), CLS_ID], np.int32)


def decode(tokens) -> tuple[str, str]:
    """``(language, text)`` of ``[BOS_language] w_1 .. w_N [CLS]`` (what ``encode`` made)."""
    tokens = [int(t) for t in tokens]
    languages = {bos: name for name, bos in BOS_IDS.items()}
    symbols = {i: symbol for symbol, i in SYMBOL_IDS.items()}
    if len(tokens) < 2 or tokens[0] not in languages or tokens[-1] != CLS_ID:
        raise ValueError(f"tokens must be [BOS_language] symbols... [CLS], got {tokens}")
    if any(t not in symbols for t in tokens[1:-1]):
        raise ValueError(f"tokens between [BOS] and [CLS] must be symbols, got {tokens[1:-1]}")
    return languages[tokens[0]], "".join(symbols[t] for t in tokens[1:-1])


def labelled_element(language: str, text: str, label: bool) -> dict[str, np.ndarray]:
    """The element ``[BOS] w [CLS] [LABEL]`` with its loss on ``LABEL`` only."""
    tokens = np.append(encode(language, text), ACCEPT_ID if label else REJECT_ID).astype(np.int32)
    loss_mask = np.zeros(tokens.size, np.float32)
    loss_mask[-1] = 1.0
    return {"tokens": tokens, "loss_mask": loss_mask}


def element_to_example(element: dict[str, np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
    """The batch fields ``[seq_len]`` of one element at the front of an otherwise empty row.

    As ``packing.shift_row`` of that row, except that the label never appears among the inputs:
    the segment covers exactly ``[BOS] w [CLS]``.
    """
    tokens, loss_mask = element["tokens"], element["loss_mask"]
    size = tokens.size - 1
    if size > seq_len:
        raise ValueError(f"an example of {size - 2} symbols needs seq_len >= {size}, got {seq_len}")
    example = {"inputs": np.zeros(seq_len, np.int32), "targets": np.zeros(seq_len, np.int32),
               "segment_ids": np.zeros(seq_len, np.int32), "positions": np.zeros(seq_len, np.int32),
               "loss_mask": np.zeros(seq_len, np.float32)}
    example["inputs"][:size] = tokens[:-1]
    example["targets"][:size] = tokens[1:]
    example["loss_mask"][:size] = loss_mask[1:]
    example["segment_ids"][:size] = 1
    example["positions"][:size] = np.arange(size)
    return example


def stack_rows(rows: list[dict]) -> dict[str, np.ndarray]:
    """One batch ``{field: [len(rows), ...]}`` of rows of equal length."""
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


def labelled_batch(language: str, examples, seq_len: int | None = None) -> dict[str, np.ndarray]:
    """Batch fields ``[len(examples), seq_len]`` for ``[(text, label), ...]`` (default seq_len: longest + 2)."""
    if not examples:
        raise ValueError("examples must hold at least one (text, label) pair")
    seq_len = seq_len or max(len(text) for text, _ in examples) + 2
    return stack_rows([element_to_example(labelled_element(language, text, label), seq_len)
                       for text, label in examples])


def evaluation_set(language: str, length: int, num: int, seed: int) -> dict[str, np.ndarray]:
    """``sample(language, num, length, seed)`` as one batch of rows of exactly ``length + 2`` tokens."""
    return labelled_batch(language, sample(language, num, length, seed), seq_len=length + 2)
