"""``debdocs``: English text from Debian packages, cleaned, split by hash, with a manifest.

Packages (``PACKAGES``; a name given as a regex is resolved to the newest matching package):

* ``python3.X-doc``: the reST sources of the Python documentation (``html/_sources/**/*.rst.txt``),
  one document per file, cleaned by ``cleaning.clean_rst``;
* ``linux-doc-X.Y``: the kernel's reST documentation (``Documentation/**/*.rst.gz``), one document
  per file, ``clean_rst``;
* ``dict-gcide``: the GNU Collaborative International Dictionary of English, one document per
  entry (``cleaning.gcide_entries`` / ``clean_gcide_entry``);
* ``fortunes``, ``fortunes-min``: one document per fortune (``cleaning.split_fortunes``).

A document is named ``<corpus part>/<path or headword>[#k]``; names are unique. Split: with
``u = blake2b(name) / 2**64`` (``seqmodels.data.document_split.heldout_scores``), a document is
``validation`` if ``u < validation_fraction``, ``test`` if ``u < validation_fraction + test_fraction``,
else ``train``: a document's split depends on its name only, not on which other documents exist or on
their order. Output (``write_corpus``): ``train.jsonl``, ``validation.jsonl``, ``test.jsonl``
(one ``{"name", "package", "text"}`` object a line, in package then file order) and
``manifest.json`` (packages with versions and sha256 of each ``.deb``, document counts, the split
rule, the sha256 and size of every output file). Train on it with ``data.source=jsonl
data.path=DIR/train.jsonl data.heldout_path=DIR/validation.jsonl``.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from seqmodels.data.builders.corpora import cleaning, deb
from seqmodels.data.builders.files import file_sha256
from seqmodels.data.document_split import heldout_scores

SPLITS = ("train", "validation", "test")
MANIFEST = "manifest.json"


@dataclasses.dataclass(frozen=True)
class PackageDocuments:
    """A package (``name``, or a regex resolved by apt when ``pattern``), the files read from it and its documents.

    ``accept(path)`` picks the package files to read; ``documents({path: bytes})`` yields ``(name, text)``.
    """

    name: str
    accept: Callable[[str], bool]
    documents: Callable[[Mapping[str, bytes]], Iterator[tuple[str, str]]]
    pattern: bool = False


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def python_doc_documents(files: Mapping[str, bytes]) -> Iterator[tuple[str, str]]:
    for path in sorted(files):
        yield "python-doc/" + path.split("/_sources/", 1)[1].removesuffix(".txt"), cleaning.clean_rst(_text(files[path]))


def linux_doc_documents(files: Mapping[str, bytes]) -> Iterator[tuple[str, str]]:
    for path in sorted(files):
        data = gzip.decompress(files[path]) if path.endswith(".gz") else files[path]
        name = "linux-doc/" + path.split("/Documentation/", 1)[1].removesuffix(".gz")
        yield name, cleaning.clean_rst(_text(data))


def gcide_documents(files: Mapping[str, bytes]) -> Iterator[tuple[str, str]]:
    index = [p for p in files if p.endswith("gcide.index")]
    dictionary = [p for p in files if p.endswith("gcide.dict.dz") or p.endswith("gcide.dict")]
    if len(index) != 1 or len(dictionary) != 1:
        raise ValueError(f"dict-gcide: expected one gcide.index and one gcide.dict(.dz), got {sorted(files)}")
    data = files[dictionary[0]]
    data = gzip.decompress(data) if dictionary[0].endswith(".dz") else data  # dictzip is gzip with an index
    counts: dict[str, int] = {}
    for headword, entry in cleaning.gcide_entries(_text(files[index[0]]), data):
        counts[headword] = counts.get(headword, 0) + 1
        yield f"gcide/{headword}#{counts[headword]}", cleaning.clean_gcide_entry(entry)


def fortune_documents(files: Mapping[str, bytes]) -> Iterator[tuple[str, str]]:
    for path in sorted(files):
        for number, entry in enumerate(cleaning.split_fortunes(_text(files[path])), 1):
            yield f"fortunes/{os.path.basename(path)}#{number}", entry


def _is_fortune_file(path: str) -> bool:
    return "/games/fortunes/" in path and not path.endswith((".dat", ".u8")) and "/off/" not in path


PACKAGES = (
    PackageDocuments(r"python3\.[0-9]+-doc", lambda p: "/html/_sources/" in p and p.endswith(".rst.txt"),
                     python_doc_documents, pattern=True),
    PackageDocuments(r"linux-doc-[0-9]+\.[0-9]+", lambda p: "/Documentation/" in p and p.endswith((".rst", ".rst.gz")),
                     linux_doc_documents, pattern=True),
    PackageDocuments("dict-gcide", lambda p: p.endswith(("gcide.index", "gcide.dict.dz")), gcide_documents),
    PackageDocuments("fortunes", _is_fortune_file, fortune_documents),
    PackageDocuments("fortunes-min", _is_fortune_file, fortune_documents),
)


def split_of(names: Sequence[str], validation_fraction: float, test_fraction: float) -> list[str]:
    """The split of each document name (module docstring)."""
    _check_fractions(validation_fraction, test_fraction)
    scores = heldout_scores(list(names))
    return ["validation" if u < validation_fraction else "test" if u < validation_fraction + test_fraction
            else "train" for u in scores]


def _check_fractions(validation_fraction: float, test_fraction: float) -> None:
    for key, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
            raise ValueError(f"{key} must be a number in (0, 1), got {value!r}")
    if validation_fraction + test_fraction >= 1.0:
        raise ValueError(f"validation_fraction + test_fraction must be < 1 (train needs documents), got "
                         f"{validation_fraction} + {test_fraction}")


def check_output_dir(out: str) -> None:
    """Refuse an output directory that already holds a corpus (nothing is overwritten)."""
    taken = [name for name in (*(f"{s}.jsonl" for s in SPLITS), MANIFEST) if os.path.exists(os.path.join(out, name))]
    if taken:
        raise FileExistsError(f"--out {out!r} already holds {', '.join(taken)}; choose another directory or remove "
                              "them first (nothing was overwritten)")


def write_corpus(out: str, parts: Iterable[tuple[dict, Iterable[tuple[str, str]]]], *,
                 validation_fraction: float = 0.01, test_fraction: float = 0.01) -> dict:
    """Write the split JSONL files and ``manifest.json`` of ``parts`` into ``out``; return the manifest.

    ``parts`` yields ``(package record, documents)``: the record (``package``, ``version``, ...) goes
    into the manifest with its document counts; documents are ``(name, text)``; empty texts are
    skipped. Files are written under temporary names and renamed only when complete.
    """
    _check_fractions(validation_fraction, test_fraction)
    check_output_dir(out)
    os.makedirs(out, exist_ok=True)
    temporary = {split: os.path.join(out, f".{split}.jsonl.partial") for split in SPLITS}
    handles = {split: open(path, "w", encoding="utf-8") for split, path in temporary.items()}
    packages, seen = [], set()
    try:
        for record, documents in parts:
            counts = dict.fromkeys(SPLITS, 0)
            batch = [(name, text) for name, text in documents if text.strip()]
            for name, _ in batch:
                if name in seen:
                    raise ValueError(f"{record['package']}: document name {name!r} occurs twice")
                seen.add(name)
            for (name, text), split in zip(batch, split_of([n for n, _ in batch], validation_fraction, test_fraction)):
                handles[split].write(json.dumps({"name": name, "package": record["package"], "text": text},
                                                ensure_ascii=False) + "\n")
                counts[split] += 1
            packages.append({**record, "documents": counts})
    finally:
        for handle in handles.values():
            handle.close()
    outputs = {}
    for split, path in temporary.items():
        final = os.path.join(out, f"{split}.jsonl")
        os.replace(path, final)
        outputs[f"{split}.jsonl"] = {"sha256": file_sha256(final), "bytes": os.path.getsize(final),
                                     "documents": sum(p["documents"][split] for p in packages)}
    manifest = {"corpus": "debdocs", "packages": packages, "outputs": outputs,
                "split": {"rule": "u = blake2b(name, digest_size=8) / 2**64; validation if u < v, test if "
                                  "u < v + t, else train", "validation_fraction": validation_fraction,
                          "test_fraction": test_fraction}}
    with open(os.path.join(out, MANIFEST), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2)
        handle.write("\n")
    return manifest


def package_parts(debs_dir: str) -> Iterator[tuple[dict, Iterator[tuple[str, str]]]]:
    """Download (or reuse) every package of ``PACKAGES`` into ``debs_dir``; yield its record and documents."""
    names = [deb.resolve_newest(p.name) if p.pattern else p.name for p in PACKAGES]
    paths = deb.download(names, debs_dir)
    for spec, name in zip(PACKAGES, names):
        path = paths[name]
        control = deb.deb_control(path)
        files = dict(deb.deb_files(path, spec.accept))
        if not files:
            raise ValueError(f"{path}: no file of this package is one the debdocs corpus reads; its layout changed")
        record = {"package": control.get("Package", name), "version": control.get("Version", "?"),
                  "deb": os.path.basename(path), "deb_sha256": file_sha256(path), "files_read": len(files)}
        yield record, spec.documents(files)


def build_debdocs(out: str, *, debs_dir: str | None = None, validation_fraction: float = 0.01,
                  test_fraction: float = 0.01) -> dict:
    """``python -m seqmodels.data.builders.corpora debdocs --out DIR``: fetch, clean, split, write; return the manifest."""
    check_output_dir(out)
    debs_dir = debs_dir or os.path.join(out, "debs")
    return write_corpus(out, package_parts(debs_dir), validation_fraction=validation_fraction,
                        test_fraction=test_fraction)


