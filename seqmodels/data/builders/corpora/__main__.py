"""``python -m seqmodels.data.builders.corpora debdocs --out data/debdocs [--debs DIR]``: build a text corpus."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from seqmodels.data.builders.corpora import CORPORA
from seqmodels.data.builders.corpora.deb import AptError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqmodels.data.builders.corpora", description=__doc__)
    parser.add_argument("corpus", choices=sorted(CORPORA), help="which corpus to build")
    parser.add_argument("--out", required=True, help="directory to write train/validation/test.jsonl and manifest.json")
    parser.add_argument("--debs", default=None, help="directory of downloaded .deb files (default OUT/debs; reused)")
    parser.add_argument("--validation-fraction", type=float, default=0.01)
    parser.add_argument("--test-fraction", type=float, default=0.01)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        manifest = CORPORA[args.corpus](args.out, debs_dir=args.debs, validation_fraction=args.validation_fraction,
                                        test_fraction=args.test_fraction)
    except (AptError, FileExistsError, ValueError, OSError) as error:
        print(f"corpora: {error}", file=sys.stderr)
        return 2
    for package in manifest["packages"]:
        print(f"corpora: {package['package']} {package['version']}: {package['documents']}")
    for name, output in manifest["outputs"].items():
        print(f"corpora: {args.out}/{name}: {output['documents']} documents, {output['bytes']:,} bytes")
    print(f"corpora: done in {time.perf_counter() - start:.0f} s; manifest {args.out}/manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
