"""Text with invalid UTF-8 is read with U+FFFD in its place, counted, and reported once per source."""

from seqmodels.data.document_files import text_file_documents


def test_invalid_utf8_is_counted_and_reported_once(tmp_path, capsys):
    (tmp_path / "a.txt").write_bytes(b"ok \xff\xfe and \xc3 end")
    (tmp_path / "b.txt").write_bytes(b"more \xff")
    (tmp_path / "c.txt").write_bytes("clean \u00e9".encode())
    docs = text_file_documents(str(tmp_path / "*.txt"), origin=f"data.path={tmp_path}/*.txt (invalid utf8 test)")
    texts = [docs[i] for i in range(len(docs))] + [docs[0]]
    assert texts[0] == "ok \ufffd\ufffd and \ufffd end" and texts[1] == "more \ufffd" and texts[2] == "clean \u00e9"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "a.txt holds 3 invalid UTF-8 byte sequence(s)" in err[0]
