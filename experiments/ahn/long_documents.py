"""The long documents of a JSONL corpus, for distilling AHN at a window it can compress beyond.

    python experiments/ahn/long_documents.py --input data/debdocs --min-chars 16000 --out data/debdocs_long

Reads ``train.jsonl``, ``validation.jsonl`` and ``test.jsonl`` of ``--input`` (the ``debdocs`` corpus's
layout: ``python -m seqmodels.data.builders.corpora debdocs --out data/debdocs``), keeps the documents of at
least ``--min-chars`` characters of text, and writes them, in their order, to the same three names under
``--out`` with ``manifest.json`` (counts, characters, sha256 of each output). A packed row of
``data.seq_len`` tokens then lies mostly inside one document, so the positions beyond the window have
context worth compressing; short documents (dictionary entries, fortunes) would fill rows with unrelated
text. At 16,000 characters the SmolLM2 tokenizer gives about 4,000 tokens or more per document.

``--out`` must not hold these files already: an existing output is refused, never overwritten.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

SPLITS = ("train", "validation", "test")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="directory with train.jsonl, validation.jsonl, test.jsonl")
    parser.add_argument("--min-chars", type=int, default=16_000, help="shortest document kept (characters)")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--out", required=True, help="new directory for the filtered splits")
    args = parser.parse_args(argv)
    if args.min_chars < 1:
        parser.error(f"--min-chars must be >= 1, got {args.min_chars}")
    return args


def keep_long(source: Path, target: Path, *, min_chars: int, field: str) -> dict:
    """Copy the lines of ``source`` whose ``field`` has at least ``min_chars`` characters to ``target``."""
    kept = total = chars = 0
    digest = hashlib.sha256()
    with source.open() as lines, target.open("x") as out:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            total += 1
            try:
                text = json.loads(line)[field]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise SystemExit(f"{source}:{number}: not a JSON object with a {field!r} field ({error})")
            if len(text) >= min_chars:
                out.write(line if line.endswith("\n") else line + "\n")
                digest.update(line.encode())
                kept += 1
                chars += len(text)
    return {"documents": kept, "of": total, "characters": chars, "sha256": digest.hexdigest()}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from seqmodels.compilation import use_compilation_cache
    use_compilation_cache()  # SEQMODELS_COMPILATION_CACHE, else ~/.cache/seqmodels/xla ('' = none)
    source, out = Path(args.input), Path(args.out)
    missing = [str(source / f"{split}.jsonl") for split in SPLITS if not (source / f"{split}.jsonl").is_file()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: build the corpus first "
                         "(python -m seqmodels.data.builders.corpora debdocs --out DIR)")
    existing = [str(out / name) for name in (*(f"{split}.jsonl" for split in SPLITS), "manifest.json")
                if (out / name).exists()]
    if existing:
        raise SystemExit(f"{', '.join(existing)} already exist: choose another --out (nothing was written)")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"input": str(source), "min_chars": args.min_chars, "splits": {}}
    for split in SPLITS:
        manifest["splits"][split] = keep_long(source / f"{split}.jsonl", out / f"{split}.jsonl",
                                              min_chars=args.min_chars, field=args.text_field)
        counts = manifest["splits"][split]
        print(f"{split}: {counts['documents']} of {counts['of']} documents, {counts['characters']:,} characters")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
