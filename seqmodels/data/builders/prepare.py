"""Write documents into ArrayRecord shards: text for ``data.source=arrayrecord``, token ids for ``token_ids``.

    python -m seqmodels.data.builders.prepare --input 'corpus/**/*.txt' --output shards/ --shards 8
    python -m seqmodels.data.builders.prepare --input data/debdocs/train.jsonl --tokenizer hf:tokenizers/debdocs-16k \
        --output data/debdocs-16k/train --shards 8 --workers 2

With ``--tokenizer`` the documents (text files, or the ``--text-field`` of each line of ``.jsonl``
inputs) are tokenized by ``--workers`` processes into shards of token ids (``token_shards.py``), so
training reads ids, not text: ``data.source=token_ids data.path='DIR/*.array_record'`` with the same
``data.tokenizer``. Without it, as follows.

Files matching ``--input`` (sorted, empty files skipped) become one record each: the file's text
as UTF-8 (invalid bytes replaced by U+FFFD). Shard ``k`` of ``N`` holds a contiguous run of the
sorted files, so record indices follow the sorted file order. Shards are written with
``group_size:1`` (one record per chunk), which grain needs for fast random access. Then train with
``data.source=arrayrecord data.path='shards/*.array_record'``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

from seqmodels.data.builders.files import input_files, iter_texts
from seqmodels.data.builders.token_shards import write_token_shards
from seqmodels.data.document_files import text_file_documents
from seqmodels.data.shards import SHARD_SUFFIX, WRITER_OPTIONS, shard_paths


def prepare_shards(input_glob: str, output_dir: str, num_shards: int,
                   prefix: str = "documents") -> list[str]:
    """Write the files matching ``input_glob`` into ``num_shards`` shards; return the shard paths."""
    from array_record.python.array_record_module import ArrayRecordWriter

    documents = text_file_documents(input_glob, origin=f"--input {input_glob!r}")
    if not isinstance(num_shards, int) or not 1 <= num_shards <= len(documents):
        raise ValueError(f"--shards must be an int in [1, {len(documents)}] (the number of "
                         f"non-empty input files), got {num_shards!r}")
    os.makedirs(output_dir, exist_ok=True)
    existing = sorted(f for f in os.listdir(output_dir) if f.endswith(SHARD_SUFFIX))
    if existing:
        raise ValueError(f"--output {output_dir!r} already holds shards ({existing[0]}, ...); "
                         "choose an empty directory so that old shards do not mix with new ones")
    paths = shard_paths(output_dir, num_shards, prefix)
    bounds = np.linspace(0, len(documents), num_shards + 1).round().astype(int)
    for path, start, stop in zip(paths, bounds[:-1], bounds[1:]):
        writer = ArrayRecordWriter(path, WRITER_OPTIONS)
        for index in range(start, stop):
            writer.write(documents[index].encode("utf-8"))
        writer.close()
    return paths


def input_texts(input_glob: str, text_field: str) -> list[str]:
    """The documents of ``--input``: each ``.jsonl`` line's ``text_field``, each other file's whole text."""
    return list(iter_texts(input_files(input_glob), text_field))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqmodels.data.builders.prepare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="glob of text files ('**' recurses); quote it")
    parser.add_argument("--output", required=True, help="directory to write the shards into")
    parser.add_argument("--shards", type=int, default=1, help="number of shards (default 1)")
    parser.add_argument("--prefix", default=None, help="shard file name prefix (default documents, or tokens)")
    parser.add_argument("--tokenizer", default=None, help="write token ids of this data.tokenizer (byte, hf:DIR)")
    parser.add_argument("--workers", type=int, default=1, help="--tokenizer: processes tokenizing shards in parallel")
    parser.add_argument("--text-field", default="text", help="--tokenizer: the JSON field of .jsonl inputs")
    args = parser.parse_args(argv)
    try:
        if args.tokenizer:
            return _prepare_tokens(args)
        args.prefix = args.prefix or "documents"
        paths = prepare_shards(args.input, args.output, args.shards, args.prefix)
    except ValueError as error:
        print(f"prepare: {error}", file=sys.stderr)
        return 2
    pattern = os.path.join(args.output, f"{args.prefix}-*{SHARD_SUFFIX}")
    print(f"prepare: wrote {len(paths)} shards; train with data.source=arrayrecord "
          f"data.path='{pattern}'")
    return 0


def _prepare_tokens(args) -> int:
    texts = input_texts(args.input, args.text_field)
    if not 1 <= args.shards <= max(1, len(texts)):
        raise ValueError(f"--shards must be in [1, {len(texts)}] (the number of documents), got {args.shards}")
    metadata = write_token_shards(texts, args.output, args.shards, args.tokenizer, prefix=args.prefix or "tokens",
                                  workers=args.workers)
    pattern = os.path.join(args.output, f"{args.prefix or 'tokens'}-*{SHARD_SUFFIX}")
    print(f"prepare: wrote {len(metadata['shards'])} shards, {metadata['documents']:,} documents, "
          f"{metadata['tokens']:,} tokens; train with data.source=token_ids data.path='{pattern}' "
          f"data.tokenizer={args.tokenizer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
