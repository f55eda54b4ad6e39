"""RULER's multi-hop tracing (``vt``) and aggregation (``cwe``, ``fwe``) tasks; ``seqmodels.data.ruler_tasks``
documents them and how they follow RULER. Each task is a ``*_draw(rng, ...)`` of its random content
(references first, so the answer budget is known) and a ``*_build(draw, ..., budget, encode)`` of a prompt
of exactly ``budget`` tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from seqmodels.data.ruler_pieces import NOISE, TokenCache, fill, frame, insert, largest_fitting, nonce_word

VT_PREFIX = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = ("\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: "
               "According to the chain(s) of variable assignment in the text above, {count} variables are "
               "assigned the value {value}, they are: ")
CWE_PREFIX = ("Below is a numbered list of words. In these words, some appear more often than others. "
              "Memorize the ones that appear most often.\n")
CWE_QUESTION = ("\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words "
                "that appear most often in the list are:")
FWE_PREFIX = ("Read the following coded text and track the frequency of each coded word. Find the three most "
              "frequently appeared coded words. ")
FWE_QUESTION = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                "most frequently appeared words in the above coded text? Answer: According to the coded text "
                "above, the three most frequently appeared words are:")
VT_HOPS = 4
CWE_COMMON = 10
FWE_ALPHA = 2.0  # RULER's default; zeta(2) = pi^2 / 6


def _variables(rng, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(chr(ord("A") + int(c)) for c in rng.integers(26, size=5))
        names += [name] if name not in names else []
    return names



def vt_draw(rng) -> dict:
    names = _variables(rng, 2 * (VT_HOPS + 1))
    value, example_value = (str(int(v)) for v in rng.choice(np.arange(10000, 100000), size=2, replace=False))
    return {"names": names[:VT_HOPS + 1], "value": value, "example_names": names[VT_HOPS + 1:],
            "example_value": example_value, "references": tuple(names[:VT_HOPS + 1])}



def _chain(names: Sequence[str], value: str) -> list[str]:
    return [f"\nVAR {names[0]} = {value}"] + [f"\nVAR {b} = VAR {a} " for a, b in zip(names, names[1:])]



def _vt_example(draw: dict) -> str:
    """RULER's in-context example: the task on five noise lines, answered."""
    lines = ["\n" + NOISE] * 5
    for offset, line in zip((0, 1, 2, 3, 4), _chain(draw["example_names"], draw["example_value"])):
        lines.insert(offset * 2, line)
    question = VT_QUESTION.format(value=draw["example_value"], count=VT_HOPS + 1)
    return VT_PREFIX + "".join(lines).lstrip("\n") + question + " ".join(draw["example_names"]) + "\n"



def vt_build(draw: dict, depth: float, budget: int, encode: TokenCache, rng) -> np.ndarray:
    prefix = _vt_example(draw) + VT_PREFIX
    question = VT_QUESTION.format(value=draw["value"], count=VT_HOPS + 1)
    chain = [encode(line) for line in _chain(draw["names"], draw["value"])]
    fixed = 1 + encode(prefix).size + encode(question).size + sum(ids.size for ids in chain)
    haystack = fill(lambda i: "\n" + NOISE, budget - fixed, encode)
    start = int(len(haystack) * depth)
    later = sorted(rng.integers(start, len(haystack) + 1, size=len(chain) - 1).tolist())
    return frame(encode, prefix, insert(haystack, list(zip([start, *later], chain))), question)



def _numbered(words: Sequence[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))



def _cwe_list(rng, words: list[str], count: int, common_repeats: int, rare_repeats: int) -> tuple[str, list[str]]:
    chosen = words[:count]
    common, rare = chosen[:CWE_COMMON], chosen[CWE_COMMON:]
    listed = common * common_repeats + rare * rare_repeats
    return _numbered([listed[i] for i in rng.permutation(len(listed))]), common



def _unique_words(rng, count: int) -> list[str]:
    words: list[str] = []
    seen = set()
    while len(words) < count:
        word = nonce_word(rng)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words



def cwe_draw(rng, length: int) -> dict:
    repeats = (6, 1) if length < 4096 else (30, 3)
    example_repeats = (3, 1, 20) if length < 4096 else (10, 3, 40)
    pool = _unique_words(rng, max(length // 2, 64))
    example_rng = np.random.default_rng(rng.integers(2**32))
    example_list, example_answer = _cwe_list(example_rng, _unique_words(example_rng, example_repeats[2]),
                                             example_repeats[2], *example_repeats[:2])
    example = CWE_PREFIX + example_list + CWE_QUESTION + " " + _numbered(example_answer) + "\n"
    return {"pool": pool, "repeats": repeats, "example": example, "list_seed": int(rng.integers(2**32)),
            "references": tuple(pool[:CWE_COMMON])}



def _list_prompt(encode: TokenCache, budget: int, prefix: str, question: str, context_of: Callable[[int], str],
                 low: int, high: int) -> np.ndarray:
    fixed = 1 + encode(prefix).size + encode(question).size

    def fits(count: int) -> bool:
        return fixed + encode(context_of(count)).size <= budget

    count = largest_fitting(low, high, fits)
    if count is None:
        smallest = fixed + encode(context_of(low)).size
        raise ValueError(f"the template and the smallest list need {smallest} prompt tokens, {smallest - budget} "
                         f"more than this length leaves; use a longer length")
    body = encode(context_of(count))
    return frame(encode, prefix, [body], question, pad=(budget - fixed - body.size) // max(encode(" ").size, 1))



def cwe_build(draw: dict, budget: int, encode: TokenCache) -> np.ndarray:
    def context_of(count: int) -> str:
        return _cwe_list(np.random.default_rng(draw["list_seed"]), draw["pool"], count, *draw["repeats"])[0]
    return _list_prompt(encode, budget, draw["example"] + CWE_PREFIX, CWE_QUESTION, context_of,
                        CWE_COMMON + 1, len(draw["pool"]))



def _fwe_vocabulary(rng, size: int) -> list[str]:
    vocabulary = sorted({"".join(chr(ord("a") + int(c)) for c in rng.integers(26, size=6)) for _ in range(size)})
    vocabulary = [vocabulary[i] for i in rng.permutation(len(vocabulary))]
    vocabulary[0] = "..."  # the top-ranked word is noise
    return vocabulary



def fwe_draw(rng, length: int) -> dict:
    vocabulary = _fwe_vocabulary(rng, max(length // 50, 5))
    return {"vocabulary": vocabulary, "list_seed": int(rng.integers(2**32)), "references": tuple(vocabulary[1:4])}



def fwe_build(draw: dict, budget: int, encode: TokenCache) -> np.ndarray:
    vocabulary = draw["vocabulary"]
    ranks = np.arange(1, len(vocabulary) + 1)
    zeta = math.pi ** 2 / 6

    def context_of(count: int) -> str:
        counts = (count * ranks ** -FWE_ALPHA / zeta).astype(int)
        words = [w for w, c in zip(vocabulary, counts) for _ in range(c)]
        order = np.random.default_rng(draw["list_seed"]).permutation(len(words))
        return " ".join(words[i] for i in order)
    low = int(math.ceil(4 ** FWE_ALPHA * zeta))  # rank 4 occurs at least once
    return _list_prompt(encode, budget, FWE_PREFIX, FWE_QUESTION, context_of, low, max(budget, low))
