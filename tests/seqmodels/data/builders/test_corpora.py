"""The debdocs corpus: markup removal on fixture documents, the hash split, the manifest, the .deb reader."""

import gzip
import io
import json
import tarfile

import pytest

from seqmodels.data.builders.corpora import cleaning, deb, debdocs

RST = """\
.. _enum-howto:

==========
Enum HOWTO
==========

.. toctree::
   :maxdepth: 2

   library/enum

.. function:: open(file, mode='r')

   Open *file* and return a :term:`file object`.  See :func:`~os.path.join` and
   :ref:`the tutorial <tut-files>` for ``mode`` values, or **read** `the docs <https://docs.python.org>`_.

.. note::
   :class: tip

   Notes keep their body.

.. This is a comment
   spanning two lines.

+-----+-----+
| a   | b   |
+-----+-----+

Example::

    >>> print(|version|)
"""


def test_clean_rst_removes_markup_and_keeps_prose():
    text = cleaning.clean_rst(RST)
    assert text.splitlines()[0] == "Enum HOWTO"
    assert "open(file, mode='r')" in text
    assert "Open file and return a file object.  See join and" in text
    assert "the tutorial for mode values, or read the docs." in text
    assert "Notes keep their body." in text
    for markup in ("..", "::", ":func:", "``", "**", "toctree", "maxdepth", "library/enum", "comment", "====",
                   "+-----+", "enum-howto", "https://", ":class:"):
        assert markup not in text, markup
    assert "Example:" in text and ">>> print(version)" in text
    assert "\n\n\n" not in text


def test_clean_rst_refuses_bytes():
    with pytest.raises(TypeError, match="text must be str"):
        cleaning.clean_rst(b"x")


def test_gcide_entries_read_the_index_and_clean_each_entry():
    entries = ["Abuse \\A*buse\"\\, v. t. To use ill; see {Misuse}.\n      [1913 Webster]\n",
               "Apple \\Ap\"ple\\, n. A fruit. [WordNet 1.5]\n"]
    dictionary = "".join(entries).encode()
    first, second = len(entries[0].encode()), len(entries[1].encode())

    def number(value):
        digits = ""
        while True:
            digits = cleaning._DICTD_DIGITS[value % 64] + digits
            value //= 64
            if not value:
                return digits

    index = (f"00-database-info\t{number(0)}\t{number(5)}\nabuse\t{number(0)}\t{number(first)}\n"
             f"misuse\t{number(0)}\t{number(first)}\napple\t{number(first)}\t{number(second)}\n")
    found = cleaning.gcide_entries(index, dictionary)
    assert [headword for headword, _ in found] == ["abuse", "apple"]  # licence skipped, shared entry kept once
    assert cleaning.clean_gcide_entry(found[0][1]) == "Abuse, v. t. To use ill; see Misuse."
    assert cleaning.clean_gcide_entry(found[1][1]) == "Apple, n. A fruit."
    with pytest.raises(ValueError, match="past the dictionary"):
        cleaning.gcide_entries(f"x\t{number(0)}\t{number(10_000)}\n", dictionary)
    with pytest.raises(ValueError, match="not a dictd base-64 number"):
        cleaning.dictd_number("A!")


def test_split_fortunes():
    assert cleaning.split_fortunes("one\n  -- A\n%\n\n%\ntwo\n%\n") == ["one\n  -- A", "two"]


def test_split_is_stable_under_reordering_and_other_documents():
    names = [f"doc/{i}" for i in range(2000)]
    splits = dict(zip(names, debdocs.split_of(names, 0.05, 0.05)))
    shuffled = names[::-1][:700]
    assert dict(zip(shuffled, debdocs.split_of(shuffled, 0.05, 0.05))) == {n: splits[n] for n in shuffled}
    counts = {s: list(splits.values()).count(s) for s in debdocs.SPLITS}
    assert 50 < counts["validation"] < 150 and 50 < counts["test"] < 150
    with pytest.raises(ValueError, match="validation_fraction \\+ test_fraction"):
        debdocs.split_of(names, 0.6, 0.5)


def _parts():
    python_files = {"usr/share/doc/python3.11/html/_sources/howto/enum.rst.txt": RST.encode()}
    linux_files = {"usr/share/doc/linux-doc-6.1/Documentation/a/b.rst.gz": gzip.compress(b"Title\n=====\n\nKernel.\n")}
    fortunes = {"usr/share/games/fortunes/cookie": b"one\n%\ntwo\n%\n"}
    return [({"package": "python3.11-doc", "version": "1"}, debdocs.python_doc_documents(python_files)),
            ({"package": "linux-doc-6.1", "version": "2"}, debdocs.linux_doc_documents(linux_files)),
            ({"package": "fortunes", "version": "3"}, debdocs.fortune_documents(fortunes))]


def test_write_corpus_writes_splits_and_a_manifest_and_refuses_to_overwrite(tmp_path):
    manifest = debdocs.write_corpus(str(tmp_path), _parts(), validation_fraction=0.4, test_fraction=0.3)
    rows = {split: [json.loads(line) for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
            for split in debdocs.SPLITS}
    names = sorted(row["name"] for split in rows.values() for row in split)
    assert names == ["fortunes/cookie#1", "fortunes/cookie#2", "linux-doc/a/b.rst", "python-doc/howto/enum.rst"]
    expected = dict(zip(names, debdocs.split_of(names, 0.4, 0.3)))
    assert {row["name"]: split for split, split_rows in rows.items() for row in split_rows} == expected
    kernel = next(row for split in rows.values() for row in split if row["package"] == "linux-doc-6.1")
    assert kernel["text"] == "Title\n\nKernel."
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    assert [p["package"] for p in manifest["packages"]] == ["python3.11-doc", "linux-doc-6.1", "fortunes"]
    assert sum(sum(p["documents"].values()) for p in manifest["packages"]) == 4
    import hashlib
    for name, output in manifest["outputs"].items():
        assert output["sha256"] == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    before = (tmp_path / "train.jsonl").read_bytes()
    with pytest.raises(FileExistsError, match="already holds"):
        debdocs.write_corpus(str(tmp_path), _parts())
    assert (tmp_path / "train.jsonl").read_bytes() == before


def _tar(files: dict, compression: str = "xz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compression}") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _ar(members: dict) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in members.items():
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data
        if len(data) % 2:
            out += b"\n"
    return bytes(out)


def test_deb_reader_reads_control_and_data_without_dpkg(tmp_path):
    package = tmp_path / "fortunes_1.0_all.deb"
    package.write_bytes(_ar({"debian-binary": b"2.0\n",
                             "control.tar.gz": _tar({"./control": b"Package: fortunes\nVersion: 1:1.99\n"}, "gz"),
                             "data.tar.xz": _tar({"./usr/share/games/fortunes/cookie": b"a\n%\nb\n",
                                                  "./usr/share/games/fortunes/cookie.dat": b"\x00"})}))
    assert deb.deb_control(str(package))["Version"] == "1:1.99"
    files = dict(deb.deb_files(str(package), debdocs._is_fortune_file))
    assert files == {"usr/share/games/fortunes/cookie": b"a\n%\nb\n"}
    (tmp_path / "bad.deb").write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a Debian package"):
        deb.deb_control(str(tmp_path / "bad.deb"))


def test_download_without_apt_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(deb.shutil, "which", lambda name: None)
    with pytest.raises(deb.AptError, match="apt-get is not on PATH"):
        deb.download(["fortunes"], str(tmp_path))


def test_the_command_builds_debdocs_from_packages_offline(tmp_path, monkeypatch, capsys):
    """python -m seqmodels.data.builders.corpora debdocs on fixture packages (apt replaced by a directory of .debs)."""
    from seqmodels.data.builders.corpora.__main__ import main

    def package(name, files):
        control = _tar({"./control": f"Package: {name}\nVersion: 1.0-{len(files)}\n".encode()}, "gz")
        path = tmp_path / "debs" / f"{name}_1.0_all.deb"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.gz": control,
                              "data.tar.xz": _tar({"./" + k: v for k, v in files.items()})}))
        return str(path)

    entry = "Apple \\Ap\"ple\\, n. A fruit.\n"
    debs = {
        "python3.11-doc": package("python3.11-doc", {"usr/share/doc/python3.11/html/_sources/a.rst.txt": RST.encode()}),
        "linux-doc-6.1": package("linux-doc-6.1", {"usr/share/doc/linux-doc-6.1/Documentation/x.rst.gz":
                                                   gzip.compress(b"Kernel\n======\n\nText.\n")}),
        "dict-gcide": package("dict-gcide", {
            "usr/share/dictd/gcide.index": f"apple\tA\t{cleaning._DICTD_DIGITS[len(entry)]}\n".encode(),
            "usr/share/dictd/gcide.dict.dz": gzip.compress(entry.encode())}),
        "fortunes": package("fortunes", {"usr/share/games/fortunes/work": b"one\n%\ntwo\n%\n",
                                         "usr/share/games/fortunes/work.dat": b"\x00"}),
        "fortunes-min": package("fortunes-min", {"usr/share/games/fortunes/fortunes": b"three\n%\n"}),
    }
    newest = {r"python3\.[0-9]+-doc": "python3.11-doc", r"linux-doc-[0-9]+\.[0-9]+": "linux-doc-6.1"}
    monkeypatch.setattr(deb, "resolve_newest", lambda pattern, state_dir=None: newest[pattern])
    monkeypatch.setattr(deb, "download", lambda names, directory: {n: debs[n] for n in names})
    out = tmp_path / "debdocs"
    assert main(["debdocs", "--out", str(out), "--validation-fraction", "0.2", "--test-fraction", "0.2"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(p["package"], p["version"], sum(p["documents"].values())) for p in manifest["packages"]] == [
        ("python3.11-doc", "1.0-1", 1), ("linux-doc-6.1", "1.0-1", 1), ("dict-gcide", "1.0-2", 1),
        ("fortunes", "1.0-2", 2), ("fortunes-min", "1.0-1", 1)]
    texts = {json.loads(line)["name"]: json.loads(line)["text"] for split in debdocs.SPLITS
             for line in (out / f"{split}.jsonl").read_text().splitlines()}
    assert texts["gcide/apple#1"] == "Apple, n. A fruit."
    assert texts["fortunes/work#2"] == "two" and texts["linux-doc/x.rst"] == "Kernel\n\nText."
    assert "corpora: done" in capsys.readouterr().out
    assert main(["debdocs", "--out", str(out)]) == 2  # refuses to overwrite
    assert "already holds" in capsys.readouterr().err
