"""Markup removal: reStructuredText sources, GCIDE dictionary entries, fortune files.

Each function maps raw text to plain English text (or a list of entries); none reads files. The
rules are line-based and deliberately simple: they remove what would teach a language model
markup instead of language, and keep everything that reads as prose or code.

reST (``clean_rst``), applied in this order:

* explicit-markup blocks that hold no prose are dropped with their indented body: comments
  (``.. text`` that is no directive), hyperlink targets (``.. _name:``), substitution definitions
  (``.. |name| ...``) and the directives in ``DROPPED_DIRECTIVES`` (toctree, index, image, ...);
* other directives keep their body and their argument: ``.. function:: open(file)`` becomes
  ``open(file)``, ``.. note::`` disappears and its body stays; directive options (``:maxdepth: 2``)
  go;
* section adornment lines (a line of one repeated punctuation character, length >= 3) and table
  borders (``+---+---+``, ``=== ===``) go;
* inline markup: ``:role:`text <target>``` -> ``text``, ``:role:`~a.b.c``` -> ``c``,
  ``:role:`text``` -> ``text``, ````literal```` -> ``literal``, ```text <url>`_`` -> ``text``,
  ```text`_`` -> ``text``, ``**strong**`` / ``*emphasis*`` -> their text, ``|name|`` -> ``name``,
  footnote references ``[#]_`` / ``[1]_`` go, and a line ending in ``::`` ends in ``:``;
* runs of three or more blank lines become one blank line; leading / trailing blank lines go.

GCIDE (``gcide_entries``): the dictd ``.index`` names each entry's byte range in the ``.dict``;
entries shared by several headwords are kept once, the ``00-database-*`` entries (licence text)
are skipped. ``clean_gcide_entry`` removes source tags (``[1913 Webster]``, ``[WordNet 1.5]``),
pronunciation marks (``\\A*buse"\\`` -> nothing) and cross-reference braces (``{Abuse}`` ->
``Abuse``).

Fortunes (``split_fortunes``): a fortune file's entries are separated by lines holding only ``%``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

DROPPED_DIRECTIVES = frozenset({
    "toctree", "index", "image", "figure", "include", "highlight", "highlightlang", "raw", "only",
    "sectionauthor", "moduleauthor", "codeauthor", "contents", "tabularcolumns", "kernel-doc",
    "kernel-include", "kernel-abi", "kernel-feat", "flat-table", "literalinclude", "cssclass",
    "rst-class", "default-role", "role", "csv-table", "graphviz", "audit-event-table", "limited-api-list",
    "spelling:word-list", "SPDX-License-Identifier", "c:namespace", "c:namespace-push", "c:namespace-pop",
    "currentmodule", "program", "option-list", "opcode-list",
})
_EXPLICIT = re.compile(r"^(\s*)\.\.(?:\s+(.*))?$")
_DIRECTIVE = re.compile(r"^([\w:.+-]+)::\s*(.*)$")
_OPTION = re.compile(r"^\s*:[\w -]+:(\s.*)?$")
_ADORNMENT = re.compile(r"^\s*([=\-`:'\"~^_*+#<>.])\1{2,}\s*$")
_TABLE_BORDER = re.compile(r"^\s*(\+[-=+]+\+|=+( +=+)+)\s*$")
_ROLE_WITH_TARGET = re.compile(r":[\w:.+-]+:`([^`<]*?)\s*<[^`>]*>`")
_ROLE_TILDE = re.compile(r":[\w:.+-]+:`~(?:[^`]*\.)?([^`.]+)`")
_ROLE = re.compile(r":[\w:.+-]+:`!?([^`]*)`")
_LITERAL = re.compile(r"``(.+?)``")
_LINK_WITH_URL = re.compile(r"`([^`<]+?)\s*<[^`>]*>`__?")
_LINK = re.compile(r"`([^`]+)`__?")
_INTERPRETED = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")
_SUBSTITUTION = re.compile(r"\|(\w[\w -]*)\|_{0,2}")
_FOOTNOTE_REF = re.compile(r"\s?\[(?:#\w*|\d+|\*)\]_")
_BLANK_RUNS = re.compile(r"\n{3,}")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _explicit_block(line: str) -> tuple[bool, str] | None:
    """For an explicit-markup line: (drop the body?, text to keep); None for any other line."""
    match = _EXPLICIT.match(line)
    if not match:
        return None
    content = (match.group(2) or "").strip()
    directive = _DIRECTIVE.match(content)
    if directive is None:  # a comment, a hyperlink target, a footnote: no prose
        return True, ""
    name, argument = directive.groups()
    if content.startswith("|") or name in DROPPED_DIRECTIVES:
        return True, ""
    return False, match.group(1) + argument if argument else ""


def _block_lines(lines: list[str]) -> Iterator[str]:
    """The lines left once explicit-markup blocks and directive options are handled (module docstring)."""
    index = 0
    while index < len(lines):
        line = lines[index]
        block = _explicit_block(line)
        index += 1
        if block is None:
            yield line
            continue
        drop_body, kept = block
        if kept:
            yield kept
        base = _indent(line)
        while index < len(lines) and _OPTION.match(lines[index]) and _indent(lines[index]) > base:
            index += 1  # the directive's options
        while index < len(lines) and (not lines[index].strip() or _indent(lines[index]) > base):
            if not drop_body:
                yield lines[index]
            index += 1


def clean_inline(line: str) -> str:
    """``line`` with reST inline markup replaced by its text (module docstring)."""
    for pattern in (_ROLE_WITH_TARGET, _ROLE_TILDE, _ROLE, _LITERAL, _LINK_WITH_URL, _LINK, _INTERPRETED,
                    _STRONG, _EMPHASIS, _SUBSTITUTION):
        line = pattern.sub(r"\1", line)
    line = _FOOTNOTE_REF.sub("", line)
    if line.rstrip().endswith("::"):
        line = line.rstrip()[:-1]
        if line.strip() == ":":
            line = ""
    return line.rstrip()


def clean_rst(text: str) -> str:
    """The plain text of a reStructuredText document (module docstring); ``""`` when nothing is left."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    kept = []
    for line in _block_lines(text.replace("\r\n", "\n").split("\n")):
        if _ADORNMENT.match(line) or _TABLE_BORDER.match(line):
            continue
        kept.append(clean_inline(line))
    return _BLANK_RUNS.sub("\n\n", "\n".join(kept)).strip("\n")


_DICTD_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SOURCE_TAG = re.compile(r"^\s*\[(?:1913 Webster|WordNet[^\]]*|PJC|Century Dict\.|Webster 1913 Suppl\.|"
                         r"Chambers 1881|Wiktionary|RN|NIH|prob\. AS|AS|MW10|Dict\. of Aviation|FOLDOC|"
                         r"Johnson|Cent\. Dict\.)(?:[,;][^\]]*)?\]\s*$")
_INLINE_SOURCE_TAG = re.compile(r"\s*\[(?:1913 Webster|WordNet 1\.5|PJC)\]")
_PRONUNCIATION = re.compile(r"\s?\\[^\\\n]*\\")
_CROSS_REFERENCE = re.compile(r"\{([^{}]*)\}")


def dictd_number(digits: str) -> int:
    """A dictd index number: base 64 in the alphabet ``A-Z a-z 0-9 + /``, most significant digit first."""
    value = 0
    for digit in digits:
        position = _DICTD_DIGITS.find(digit)
        if position < 0:
            raise ValueError(f"{digits!r} is not a dictd base-64 number (bad digit {digit!r})")
        value = value * 64 + position
    return value


def gcide_entries(index: str, dictionary: bytes) -> list[tuple[str, str]]:
    """(headword, raw entry text) per distinct entry of a dictd ``.index`` / ``.dict`` pair, in index order."""
    entries, seen = [], set()
    for number, line in enumerate(index.splitlines(), 1):
        fields = line.split("\t")
        if len(fields) < 3:
            raise ValueError(f"dictd index line {number}: expected 'headword<TAB>offset<TAB>length', got {line!r}")
        headword, offset, length = fields[0], dictd_number(fields[1]), dictd_number(fields[2])
        if headword.startswith("00-") or (offset, length) in seen:
            continue
        if offset + length > len(dictionary):
            raise ValueError(f"dictd index line {number}: entry {headword!r} ends at byte {offset + length}, "
                             f"past the dictionary's {len(dictionary)} bytes")
        seen.add((offset, length))
        entries.append((headword, dictionary[offset:offset + length].decode("utf-8", errors="replace")))
    return entries


def clean_gcide_entry(text: str) -> str:
    """A GCIDE entry without source tags, pronunciation marks and cross-reference braces (module docstring)."""
    lines = [line for line in text.split("\n") if not _SOURCE_TAG.match(line)]
    text = "\n".join(lines)
    text = _INLINE_SOURCE_TAG.sub("", text)
    text = _PRONUNCIATION.sub("", text)
    text = _CROSS_REFERENCE.sub(r"\1", text)
    return _BLANK_RUNS.sub("\n\n", "\n".join(line.rstrip() for line in text.split("\n"))).strip("\n")


def split_fortunes(text: str) -> list[str]:
    """The non-empty entries of a fortune file (entries end at a line holding only ``%``)."""
    entries, current = [], []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line.strip() == "%":
            entries.append("\n".join(current).strip("\n"))
            current = []
        else:
            current.append(line.rstrip())
    entries.append("\n".join(current).strip("\n"))
    return [entry for entry in entries if entry.strip()]
