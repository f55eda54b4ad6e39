"""Pieces every RULER task is built from (``seqmodels.data.ruler_tasks``): tokens, haystack units, insertion.

A prompt is a list of token arrays, each piece tokenized on its own and concatenated at the token level,
so a prompt's length is the sum of its pieces' and can be filled exactly: ``fill`` takes haystack units
until a budget and cuts the last one at a token; ``insert`` places needles before given units.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
RULER_DEPTHS = tuple(float(d) / 100 for d in np.round(np.linspace(0, 100, num=40)).astype(int))
SENTENCE_WORDS = 50
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"


class TokenCache:
    """Encoding with a cache of repeated pieces (noise lines, template parts)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, text: str) -> np.ndarray:
        ids = self._cache.get(text)
        if ids is None:
            ids = np.asarray(self.tokenizer.encode(text), np.int32)
            if len(text) < 200:
                self._cache[text] = ids
        return ids



def nonce_word(rng: np.random.Generator, syllables: int = 3) -> str:
    return "".join(_CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
                   for _ in range(syllables))



def essay_from(documents, order, needed_chars: int) -> list[str]:
    """``essay_sentences`` of ``documents`` read in ``order`` (indices) until ``needed_chars`` characters are read."""
    texts, total = [], 0
    for index in order:
        texts.append(documents[int(index)])
        total += len(texts[-1])
        if total >= needed_chars:
            break
    return essay_sentences(texts)


def essay_sentences(texts: Sequence[str]) -> list[str]:
    """Held-out text as sentences (whitespace collapsed, split after ``.!?``), each at most SENTENCE_WORDS words."""
    sentences = []
    for text in texts:
        for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text).strip()):
            words = sentence.split(" ")
            sentences += [" ".join(words[i:i + SENTENCE_WORDS]) for i in range(0, len(words), SENTENCE_WORDS)
                          if words[i:i + SENTENCE_WORDS] != [""]]
    return sentences



def fill(units: Callable[[int], str], budget: int, encode: TokenCache) -> list[np.ndarray]:
    """Units ``units(0), units(1), ...`` tokenized until ``budget`` tokens, the last one cut to fit exactly."""
    pieces, total, index = [], 0, 0
    while total < budget:
        ids = encode(units(index))
        if ids.size == 0:
            raise ValueError("a haystack unit encodes to no tokens")
        pieces.append(ids[:budget - total])
        total += pieces[-1].size
        index += 1
    return pieces



def insert(haystack: list[np.ndarray], needles: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
    """``haystack`` with each ``(unit index, tokens)`` placed before that unit (stable for equal indices)."""
    out, order = [], sorted(range(len(needles)), key=lambda i: needles[i][0])
    cursor = 0
    for i in order:
        at, ids = needles[i]
        out += haystack[cursor:at]
        out.append(ids)
        cursor = max(cursor, at)
    return out + haystack[cursor:]



def frame(encode: TokenCache, prefix: str, body: list[np.ndarray], question: str, pad: int = 0) -> np.ndarray:
    opening, _ = encode.tokenizer.document_ids()
    space = encode(" ")
    return np.concatenate([[opening], *([space] * pad), encode(prefix), *body, encode(question)]).astype(np.int32)



def largest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    best = None
    while low <= high:
        middle = (low + high) // 2
        if fits(middle):
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best
