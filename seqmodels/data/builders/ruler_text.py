"""The text of the ``ruler`` source's training rows, as ``.jsonl`` for training a tokenizer on the tasks' own text.

    python -m seqmodels.data.builders.ruler_text --tasks niah_single_1 --rows 900 --length 512 \
        --out data/ruler_text/niah_single_1.jsonl
    python -m seqmodels.data.builders.tokenizer train --input data/ruler_text/niah_single_1.jsonl --vocab-size 512 \
        --out tokenizers/ruler-niah_single_1-512

Line ``i`` is ``{"text": ...}``: training row ``i`` of ``data.source=ruler`` (``seqmodels.data.sources.ruler``, tasks
``--tasks`` in turn, ``data.seed`` ``--seed``) built at ``--length`` bytes, from its prompt through its answer
(neither the opening nor the end-of-document token). Built in bytes, so a row's haystack is as long as
``--length`` bytes allow whatever tokenizer is trained on the text afterwards. A tokenizer trained on this text
spends its merges on the task's template and haystack: with 512 tokens the ``niah_single_1`` template is about 100
tokens against about 370 bytes, so short rows hold several haystack lines (``experiments/ruler/README.md``).

Only training rows are written: the source's held-out rows and the suite's prompts use other seeds, so no prompt
that is scored is in the tokenizer's text. An existing ``--out`` is refused, never overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np


def ruler_texts(tasks: Sequence[str], rows: int, length: int, seed: int = 0) -> list[str]:
    """The text of training rows ``0 .. rows - 1`` of the ``ruler`` source at ``length`` bytes (module docstring)."""
    import dataclasses

    from seqmodels.config import DataConfig
    from seqmodels.data.sources.ruler import check_ruler, ruler_element
    from seqmodels.data.tokenizers import get_tokenizer

    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"--rows must be an int >= 1, got {rows!r}")
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"--length must be an int >= 2 (bytes of a row), got {length!r}")
    cfg = dataclasses.replace(DataConfig(), source="ruler", tokenizer="byte", seq_len=length - 1,
                              ruler_tasks=tuple(tasks), seed=seed)
    check_ruler(cfg)  # unknown tasks, or rows too short for a task's prompt and answer: a ConfigError
    byte = get_tokenizer("byte")
    texts = []
    for index in range(rows):
        row = ruler_element(cfg, "train", index, byte)
        end = int(np.flatnonzero(row["loss_mask"])[-1])  # the end-of-document token after the answer
        texts.append(byte.decode(row["tokens"][1:end]))
    return texts


def write_ruler_texts(tasks: Sequence[str], rows: int, length: int, out: str, seed: int = 0) -> str:
    """Write ``ruler_texts`` to ``out`` as ``.jsonl``; refuse an existing ``out``; return ``out``."""
    if os.path.exists(out):
        raise FileExistsError(f"--out {out!r} already exists; choose another path or remove it (nothing was "
                              "overwritten)")
    texts = ruler_texts(tasks, rows, length, seed)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    partial = f"{out}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    os.replace(partial, out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True, help="comma-separated RULER tasks (seqmodels.data.ruler_tasks)")
    parser.add_argument("--rows", type=int, required=True, help="training rows to write")
    parser.add_argument("--length", type=int, required=True, help="bytes per row (the source's data.seq_len + 1)")
    parser.add_argument("--seed", type=int, default=0, help="the source's data.seed")
    parser.add_argument("--out", required=True, help="the .jsonl file to write (refused if it exists)")
    args = parser.parse_args(argv)
    try:
        write_ruler_texts([task for task in args.tasks.split(",") if task], args.rows, args.length, args.out,
                          args.seed)
    except (ValueError, FileExistsError) as error:  # ValueError: a ConfigError of check_ruler too
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.rows} rows of {args.tasks} at {args.length} bytes to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
