"""Context-free-language recognition data: positives and hard negatives of an exact length.

``sample(language, num, length, seed) -> [(string, label), ...]`` returns ``num`` strings of exactly
``length`` symbols, ``num - num // 2`` of them in the language, in an order shuffled by ``seed``;
every label is computed by the language's recogniser (``recognisers.py``).

Positives are drawn uniformly (or close to it) among the members of that length:

- ``dyck1`` / ``dyck2``: a uniform Dyck path by ballot-number counts (the number of paths of ``r``
  steps from height ``h`` down to 0 that never go below 0 is ``C(r, u) - C(r, u - 1)``, ``u = (r - h) / 2``),
  then (``dyck2``) a uniform bracket type per matched pair: uniform over all balanced strings;
- ``marked_palindrome`` / ``palindrome``: a uniform ``w``, then ``w # w^R`` / ``w w^R``;
- ``anbn_cmdm``: ``n`` uniform in ``[1, N/2 - 1]``; ``ambiguous``: a uniform member triple ``(i, j, k)``;
- ``bfvp``: a uniform formula of value 1 among all formulas of length ``N``, by dynamic-programming
  counts ``F[N][v]`` of formulas of length ``N`` and value ``v`` (``!E`` adds one symbol,
  ``(E op E)`` three).

Negatives are *hard*: the same length, the same symbol counts where the language allows it, one
edit away from a positive: a swap of two different symbols (Dyck, palindromes), a shifted block
boundary (a deletion plus an insertion) or a swap across a block boundary (``anbn_cmdm``,
``ambiguous``), a flipped constant or operator giving a well-formed formula of value 0 (``bfvp``).
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from seqmodels.data.cfl.recognisers import RECOGNISERS, evaluate_bfvp


@dataclass(frozen=True)
class Language:
    name: str
    alphabet: str
    min_length: int
    parity: int | None  # lengths with a positive string: length % 2 == parity (None: any)
    positive: Callable[[random.Random, int], str]
    negative: Callable[[random.Random, int], str | None]  # a candidate; None if the move does not apply

    def has_positive(self, length: int) -> bool:
        return length >= self.min_length and (self.parity is None or length % 2 == self.parity)

    def describe_lengths(self) -> str:
        kind = {None: "", 0: "even ", 1: "odd "}[self.parity]
        return f"{kind}lengths >= {self.min_length}"


# ---- moves that turn a positive into a candidate negative -------------------------------------------

def swap_two_different(rng: random.Random, text: str, symbols: str | None = None) -> str | None:
    """``text`` with two positions holding different symbols (both in ``symbols``) swapped."""
    indices = [i for i, s in enumerate(text) if symbols is None or s in symbols]
    rng.shuffle(indices)
    for i in indices:
        partners = [j for j in indices if text[j] != text[i]]
        if partners:
            j = rng.choice(partners)
            chars = list(text)
            chars[i], chars[j] = chars[j], chars[i]
            return "".join(chars)
    return None


def delete_and_insert(rng: random.Random, text: str, alphabet: str) -> str:
    """``text`` with one symbol deleted and a random symbol inserted at a random place (same length)."""
    chars = list(text)
    del chars[rng.randrange(len(chars))]
    chars.insert(rng.randrange(len(chars) + 1), rng.choice(alphabet))
    return "".join(chars)


def blocks_to_string(letters: str, lengths) -> str:
    return "".join(letter * count for letter, count in zip(letters, lengths))


def shift_block_boundary(rng: random.Random, letters: str, lengths) -> str | None:
    """Move one boundary between neighbouring blocks by one symbol (a deletion plus an insertion)."""
    moves = [(k, step) for k in range(len(lengths) - 1) for step in (-1, 1)
             if lengths[k] + step >= 1 and lengths[k + 1] - step >= 1]
    if not moves:
        return None
    k, step = rng.choice(moves)
    shifted = list(lengths)
    shifted[k] += step
    shifted[k + 1] -= step
    return blocks_to_string(letters, shifted)


def swap_across_boundary(rng: random.Random, letters: str, lengths) -> str:
    """The block string with the two symbols at one block boundary swapped (same symbol counts)."""
    chars = list(blocks_to_string(letters, lengths))
    boundary = sum(lengths[:rng.randrange(len(lengths) - 1) + 1])
    chars[boundary - 1], chars[boundary] = chars[boundary], chars[boundary - 1]
    return "".join(chars)


# ---- Dyck ----------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def ballot(steps: int, height: int) -> int:
    """Paths of ``steps`` +-1 steps from ``height`` to 0 that never go below 0."""
    if height < 0 or height > steps or (steps - height) % 2:
        return 0
    ups = (steps - height) // 2
    return math.comb(steps, ups) - (math.comb(steps, ups - 1) if ups else 0)


def dyck_path(rng: random.Random, length: int) -> list[bool]:
    """A uniform Dyck path of ``length`` (even) steps; True is an up step."""
    path, height = [], 0
    for step in range(length):
        remaining = length - step
        up = rng.randrange(ballot(remaining, height)) < ballot(remaining - 1, height + 1)
        path.append(up)
        height += 1 if up else -1
    return path


def dyck_string(rng: random.Random, length: int, pairs: str) -> str:
    """A uniform balanced string over the bracket ``pairs`` (``"()"`` or ``"()[]"``)."""
    out, open_types = [], []
    for up in dyck_path(rng, length):
        if up:
            kind = rng.randrange(len(pairs) // 2)
            open_types.append(kind)
            out.append(pairs[2 * kind])
        else:
            out.append(pairs[2 * open_types.pop() + 1])
    return "".join(out)


# ---- Boolean formulas ------------------------------------------------------------------------------

_OPERATORS = {"&": lambda x, y: x & y, "|": lambda x, y: x | y}


@functools.lru_cache(maxsize=None)
def formula_counts(length: int) -> tuple[int, int]:
    """``(F[length][0], F[length][1])``: formulas of exactly ``length`` symbols by value."""
    if length < 1:
        return 0, 0
    for shorter in range(1, length):  # fill the cache bottom-up: recursion depth stays small
        formula_counts(shorter)
    counts = [1, 1] if length == 1 else [0, 0]
    if length >= 2:
        inner = formula_counts(length - 1)
        counts[0] += inner[1]
        counts[1] += inner[0]
    for left in range(1, length - 3):
        left_counts, right_counts = formula_counts(left), formula_counts(length - 3 - left)
        for apply in _OPERATORS.values():
            for x in (0, 1):
                for y in (0, 1):
                    counts[apply(x, y)] += left_counts[x] * right_counts[y]
    return counts[0], counts[1]


@functools.lru_cache(maxsize=None)
def _formula_productions(length: int, value: int) -> tuple[list[int], list[tuple]]:
    """Cumulative weights and the productions making a formula of ``length`` and ``value``."""
    productions = []
    if length == 1:
        productions.append((1, ("constant",)))
    if length >= 2:
        productions.append((formula_counts(length - 1)[1 - value], ("not",)))
    for left in range(1, length - 3):
        right = length - 3 - left
        for operator, apply in _OPERATORS.items():
            for x in (0, 1):
                for y in (0, 1):
                    if apply(x, y) == value:
                        weight = formula_counts(left)[x] * formula_counts(right)[y]
                        productions.append((weight, ("binary", operator, left, x, y)))
    cumulative, total = [], 0
    for weight, _ in productions:
        total += weight
        cumulative.append(total)
    return cumulative, [production for _, production in productions]


def random_formula(rng: random.Random, length: int, value: int) -> str:
    """A uniform formula among those of exactly ``length`` symbols with ``value``."""
    cumulative, productions = _formula_productions(length, value)
    production = productions[bisect.bisect_right(cumulative, rng.randrange(cumulative[-1]))]
    if production[0] == "constant":
        return str(value)
    if production[0] == "not":
        return "!" + random_formula(rng, length - 1, 1 - value)
    _, operator, left, x, y = production
    return ("(" + random_formula(rng, left, x) + operator
            + random_formula(rng, length - 3 - left, y) + ")")


def flip_to_false(rng: random.Random, formula: str) -> str | None:
    """``formula`` with one constant (0<->1) or operator (&<->|) flipped so that it evaluates to 0."""
    flips = {"0": "1", "1": "0", "&": "|", "|": "&"}
    positions = [i for i, s in enumerate(formula) if s in flips]
    rng.shuffle(positions)
    for i in positions:
        candidate = formula[:i] + flips[formula[i]] + formula[i + 1:]
        if evaluate_bfvp(candidate) == 0:
            return candidate
    return None


def _bfvp_negative(rng: random.Random, length: int) -> str:
    return flip_to_false(rng, random_formula(rng, length, 1)) or random_formula(rng, length, 0)


# ---- block languages -------------------------------------------------------------------------------

def _anbn_cmdm_blocks(rng: random.Random, length: int) -> list[int]:
    n = rng.randint(1, length // 2 - 1)
    m = length // 2 - n
    return [n, n, m, m]


def _anbn_cmdm_negative(rng: random.Random, length: int) -> str | None:
    blocks = _anbn_cmdm_blocks(rng, length)
    if rng.random() < 0.5:
        return shift_block_boundary(rng, "abcd", blocks)
    return swap_across_boundary(rng, "abcd", blocks)


@functools.lru_cache(maxsize=None)
def _ambiguous_triples(length: int, member: bool) -> list[tuple[int, int, int]]:
    return [(i, j, length - i - j) for i in range(1, length - 1) for j in range(1, length - i)
            if ((i == j) or (j == length - i - j)) == member]


def _ambiguous_negative(rng: random.Random, length: int) -> str:
    outside = _ambiguous_triples(length, member=False)
    if outside and rng.random() < 0.5:
        return blocks_to_string("abc", rng.choice(outside))
    return swap_across_boundary(rng, "abc", rng.choice(_ambiguous_triples(length, member=True)))


def _random_word(rng: random.Random, length: int) -> str:
    return "".join(rng.choice("ab") for _ in range(length))


def _marked_palindrome(rng: random.Random, length: int) -> str:
    word = _random_word(rng, length // 2)
    return word + "#" + word[::-1]


def _palindrome(rng: random.Random, length: int) -> str:
    word = _random_word(rng, length // 2)
    return word + word[::-1]


LANGUAGES: dict[str, Language] = {language.name: language for language in (
    Language("dyck1", "()", 2, 0, lambda rng, n: dyck_string(rng, n, "()"),
             lambda rng, n: swap_two_different(rng, dyck_string(rng, n, "()"))),
    Language("dyck2", "()[]", 2, 0, lambda rng, n: dyck_string(rng, n, "()[]"),
             lambda rng, n: swap_two_different(rng, dyck_string(rng, n, "()[]"))),
    Language("marked_palindrome", "ab#", 1, 1, _marked_palindrome,
             lambda rng, n: swap_two_different(rng, _marked_palindrome(rng, n), "ab")),
    Language("palindrome", "ab", 2, 0, _palindrome,
             lambda rng, n: swap_two_different(rng, _palindrome(rng, n))),
    Language("anbn_cmdm", "abcd", 4, 0, lambda rng, n: blocks_to_string("abcd", _anbn_cmdm_blocks(rng, n)),
             _anbn_cmdm_negative),
    Language("ambiguous", "abc", 3, None,
             lambda rng, n: blocks_to_string("abc", rng.choice(_ambiguous_triples(n, member=True))),
             _ambiguous_negative),
    Language("bfvp", "01&|!()", 1, None, lambda rng, n: random_formula(rng, n, 1), _bfvp_negative),
)}

_TRIES = 64


def check_language(language: str, length: int | None = None) -> Language:
    """The ``Language`` named ``language``; ``ValueError`` if unknown or without positives at ``length``."""
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {sorted(LANGUAGES)}, got {language!r}")
    spec = LANGUAGES[language]
    if length is not None:
        if not isinstance(length, int) or isinstance(length, bool):
            raise ValueError(f"length must be an int, got {length!r}")
        if not spec.has_positive(length):
            raise ValueError(f"length={length}: {language} has no positive string of that length; "
                             f"it has positives at {spec.describe_lengths()}")
    return spec


def valid_lengths(language: str, low: int, high: int) -> list[int]:
    """The lengths in ``[low, high]`` at which ``language`` has positive strings."""
    spec = check_language(language)
    return [n for n in range(low, high + 1) if spec.has_positive(n)]


def nearest_valid_length(language: str, length: int) -> int:
    """``length`` if ``language`` has positives there, else the largest shorter length that has."""
    spec = check_language(language)
    for candidate in range(length, spec.min_length - 1, -1):
        if spec.has_positive(candidate):
            return candidate
    raise ValueError(f"length={length}: {language} has positives only at {spec.describe_lengths()}")


def sample_string(spec: Language, length: int, positive: bool, rng: random.Random) -> str:
    """One string of ``length`` symbols: a positive, or a hard negative (with fallbacks that stay negative)."""
    if positive:
        return spec.positive(rng, length)
    recognise = RECOGNISERS[spec.name]
    for attempt in range(3 * _TRIES):
        if attempt < _TRIES:
            candidate = spec.negative(rng, length)
        elif attempt < 2 * _TRIES:
            candidate = delete_and_insert(rng, spec.positive(rng, length), spec.alphabet)
        else:
            candidate = "".join(rng.choice(spec.alphabet) for _ in range(length))
        if candidate is not None and not recognise(candidate):
            return candidate
    raise RuntimeError(f"no negative string of length {length} found for {spec.name}")


def sample(language: str, num: int, length: int, seed: int) -> list[tuple[str, bool]]:
    """``num`` labelled strings of exactly ``length`` symbols, ``num - num // 2`` positive; see the module doc."""
    spec = check_language(language, length)
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise ValueError(f"num must be an int >= 1, got {num!r}")
    rng = random.Random(f"seqmodels.cfl:{language}:{length}:{seed}")
    wanted = [True] * (num - num // 2) + [False] * (num // 2)
    rng.shuffle(wanted)
    recognise = RECOGNISERS[language]
    strings = [sample_string(spec, length, positive, rng) for positive in wanted]
    return [(text, recognise(text)) for text in strings]
