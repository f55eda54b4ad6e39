"""What the builders read and record: the files an ``--input`` names, their texts, their sha256.

``--input`` (tokenizer training, ``prepare --tokenizer``) is a corpus directory of
``python -m seqmodels.data.builders.corpora`` (its ``train.jsonl`` only: validation and test text
never shapes what is built from the corpus), a ``.jsonl`` file, or a glob of text files. A ``.jsonl``
file holds one document per non-blank line (its ``text_field``); any other file is one document.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterator, Sequence


def input_files(spec: str) -> list[str]:
    """The files ``--input`` names (module docstring), sorted; ``ValueError`` when there are none."""
    if os.path.isdir(spec):
        train = os.path.join(spec, "train.jsonl")
        if not os.path.isfile(train):
            raise ValueError(f"--input {spec!r} is a directory without train.jsonl (build one with "
                             "`python -m seqmodels.data.builders.corpora debdocs --out DIR`), or pass a file / glob")
        return [train]
    files = sorted(p for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
    if not files:
        raise ValueError(f"--input {spec!r}: no such directory, and no file matches it as a glob")
    return files


def iter_texts(files: Sequence[str], text_field: str = "text") -> Iterator[str]:
    """Each document's text: a JSON line's ``text_field`` (``.jsonl`` files), else a whole file."""
    for path in files:
        if path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    record = json.loads(line)
                    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                        raise ValueError(f"{path}:{number}: no string field {text_field!r} "
                                         f"(set --text-field to the field holding the text)")
                    yield record[text_field]
        else:
            with open(path, encoding="utf-8", errors="replace") as handle:
                yield handle.read()


def file_sha256(path: str) -> str:
    """The hex sha256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
