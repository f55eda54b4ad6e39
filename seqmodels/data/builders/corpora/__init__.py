"""Text corpora built from what a machine can fetch: ``python -m seqmodels.data.builders.corpora NAME --out DIR``.

The registry maps a corpus name to its builder ``build(out, **options) -> manifest``; each builder writes
``train.jsonl`` / ``validation.jsonl`` / ``test.jsonl`` and ``manifest.json`` into ``out`` and refuses an
``out`` that already holds them. Corpora:

    debdocs   English documentation, dictionary entries and fortunes from Debian packages (debdocs.py)
"""

from __future__ import annotations

from collections.abc import Callable

CORPORA: dict[str, Callable[..., dict]] = {}


def register_corpus(name: str, build: Callable[..., dict]) -> None:
    """Make ``build`` the builder of corpus ``name``; a name is registered once."""
    if name in CORPORA:
        raise ValueError(f"corpus {name!r} is registered twice")
    CORPORA[name] = build


def _register_builtin() -> None:
    from seqmodels.data.builders.corpora.debdocs import build_debdocs
    register_corpus("debdocs", build_debdocs)


_register_builtin()
