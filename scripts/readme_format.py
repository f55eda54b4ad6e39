"""Formatting shared by the README table generators (``scripts/readme_tables.py``)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def markdown_table(header: list[str], rows: list[list[str]], right_from: int, right_first: bool = False) -> str:
    """A markdown table, ``| --- |`` rules, the columns from ``right_from`` on (and the first, with
    ``right_first``) right-aligned."""
    rule = ["---:" if index >= right_from or (right_first and index == 0) else "---" for index in range(len(header))]
    return "\n".join(("| " + " | ".join(cells) + " |").replace("|  |", "| |") for cells in [header, rule, *rows])


def read_text(path: str) -> str:
    """A repository file's text (``ROOT`` looked up at each call, so a test can point it at a copy)."""
    return (ROOT / path).read_text()


def load_json(path: str) -> dict:
    return json.loads(read_text(path))


def emphasised(text: str, bold: bool) -> str:
    return f"**{text}**" if bold else text


def compact_table(header: list[str], rows: list[list[str]], right_from: int | None = None) -> str:
    """A markdown table with ``|---|`` rules (``|---:|`` from column ``right_from`` on)."""
    rule = "|" + "".join("---:|" if right_from is not None and index >= right_from else "---|"
                         for index in range(len(header)))
    return "\n".join(["| " + " | ".join(header) + " |", rule,
                      *(("| " + " | ".join(cells) + " |").replace("|  |", "| |") for cells in rows)])
