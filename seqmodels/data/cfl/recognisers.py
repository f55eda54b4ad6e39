"""Membership tests for the context-free languages of the recognition suite.

Each recogniser is the plain textbook check, written to be obviously right rather than fast; the
generators in ``languages.py`` label every string they produce with these functions.

- ``dyck1`` over ``()``, ``dyck2`` over ``()[]``: balanced and properly nested brackets;
- ``marked_palindrome`` over ``ab#``: ``w # reverse(w)`` with ``w`` in ``{a, b}*``;
- ``palindrome`` over ``ab``: ``w reverse(w)`` (even length);
- ``anbn_cmdm`` over ``abcd``: ``a^n b^n c^m d^m`` with ``n, m >= 1``;
- ``ambiguous`` over ``abc``: ``a^i b^j c^k`` with ``i, j, k >= 1`` and (``i = j`` or ``j = k``);
- ``bfvp`` over ``01&|!()``: Boolean formulas ``E := 0 | 1 | !E | (E&E) | (E|E)`` whose value is 1.
"""

from __future__ import annotations

import re

_ANBN_CMDM = re.compile(r"(a+)(b+)(c+)(d+)")
_ABC_BLOCKS = re.compile(r"(a+)(b+)(c+)")


def is_dyck1(text: str) -> bool:
    depth = 0
    for symbol in text:
        if symbol == "(":
            depth += 1
        elif symbol == ")":
            depth -= 1
            if depth < 0:
                return False
        else:
            return False
    return depth == 0


def is_dyck2(text: str) -> bool:
    closing_of = {"(": ")", "[": "]"}
    expected_closers = []
    for symbol in text:
        if symbol in closing_of:
            expected_closers.append(closing_of[symbol])
        elif symbol in ")]":
            if not expected_closers or expected_closers.pop() != symbol:
                return False
        else:
            return False
    return not expected_closers


def is_marked_palindrome(text: str) -> bool:
    # One '#' and a palindrome: the '#' then sits in the middle, so text = w # reverse(w).
    return set(text) <= set("ab#") and text.count("#") == 1 and text == text[::-1]


def is_palindrome(text: str) -> bool:
    return set(text) <= set("ab") and len(text) % 2 == 0 and text == text[::-1]


def is_anbn_cmdm(text: str) -> bool:
    match = _ANBN_CMDM.fullmatch(text)
    if match is None:
        return False
    a, b, c, d = (len(group) for group in match.groups())
    return a == b and c == d


def is_ambiguous(text: str) -> bool:
    match = _ABC_BLOCKS.fullmatch(text)
    if match is None:
        return False
    i, j, k = (len(group) for group in match.groups())
    return i == j or j == k


def evaluate_bfvp(text: str) -> int | None:
    """The value (0 or 1) of a well-formed Boolean formula, or None if ``text`` is not one."""

    def parse(index: int) -> tuple[int, int] | None:
        """Parse one formula starting at ``index``: ``(value, index after it)`` or None."""
        if index >= len(text):
            return None
        symbol = text[index]
        if symbol in "01":
            return int(symbol), index + 1
        if symbol == "!":
            inner = parse(index + 1)
            return None if inner is None else (1 - inner[0], inner[1])
        if symbol != "(":
            return None
        left = parse(index + 1)
        if left is None or left[1] >= len(text) or text[left[1]] not in "&|":
            return None
        operator = text[left[1]]
        right = parse(left[1] + 1)
        if right is None or right[1] >= len(text) or text[right[1]] != ")":
            return None
        value = left[0] & right[0] if operator == "&" else left[0] | right[0]
        return value, right[1] + 1

    parsed = parse(0)
    if parsed is None or parsed[1] != len(text):
        return None
    return parsed[0]


def is_bfvp(text: str) -> bool:
    return evaluate_bfvp(text) == 1


RECOGNISERS = {
    "dyck1": is_dyck1,
    "dyck2": is_dyck2,
    "marked_palindrome": is_marked_palindrome,
    "palindrome": is_palindrome,
    "anbn_cmdm": is_anbn_cmdm,
    "ambiguous": is_ambiguous,
    "bfvp": is_bfvp,
}
