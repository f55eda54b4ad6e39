"""Fuzzing the data readers: damaged JSON-lines, Parquet and ArrayRecord files load or raise ``DataError``
naming the file (ArrayRecord in a child process: a native reader that aborted would take pytest with it)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzzing import FUZZ_CASES, SLOW_CASES, byte_cases, failures
from seqmodels.config import DataConfig

BUDGETS = [pytest.param(FUZZ_CASES, 0, id="fast"), pytest.param(SLOW_CASES, 1, id="slow", marks=pytest.mark.slow)]
TEXTS = ["def f(x):\n    return x\n", "naïve café ünïcödé", "a" * 300, "", "last line"]


def _read_every_document(corpus, cfg) -> None:
    documents, _ = corpus(cfg)
    for index in range(len(documents)):
        documents[index]


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_damaged_jsonl_files_load_or_name_the_file(tmp_path, count, seed):
    from seqmodels.data.sources.record_files import jsonl_corpus
    path = tmp_path / "docs.jsonl"
    rows = [json.dumps({"text": text, "id": i}) for i, text in enumerate(TEXTS)] + ['{"text": 5}', "[1, 2]"]
    data = ("\n".join(rows[:5]) + "\n").encode()
    cfg = dataclasses.replace(DataConfig(), source="jsonl", path=str(tmp_path / "*.jsonl"))
    cases = byte_cases(data, seed, count) + [(f"row {row!r}", data + row.encode() + b"\n") for row in rows[5:]]
    found = failures(cases, path.write_bytes, lambda: _read_every_document(jsonl_corpus, cfg))
    assert not found, "\n".join(found[:5])


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_damaged_parquet_files_load_or_name_the_file(tmp_path, count, seed):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from seqmodels.data.sources.record_files import parquet_corpus
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": TEXTS, "id": list(range(len(TEXTS)))}), path)
    data = path.read_bytes()
    cfg = dataclasses.replace(DataConfig(), source="parquet", path=str(tmp_path / "*.parquet"))
    found = failures(byte_cases(data, seed, count), path.write_bytes, lambda: _read_every_document(parquet_corpus, cfg))
    assert not found, "\n".join(found[:5])


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from fuzzing import byte_cases, failures
from seqmodels.data.builders.prepare import prepare_shards
from seqmodels.data.sources.text_documents import arrayrecord_documents
from pathlib import Path
work, count, seed = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
inputs = work / "inputs"
inputs.mkdir()
for i, text in enumerate(json.loads(sys.argv[5])):
    (inputs / f"doc_{i}.txt").write_text(text or "x")
(shard,) = prepare_shards(str(inputs / "*.txt"), str(work / "shards"), 1)

def read():
    documents = arrayrecord_documents(str(work / "shards" / "*.array_record"))
    for index in range(len(documents)):
        documents[index]

found = failures(byte_cases(Path(shard).read_bytes(), seed, count), Path(shard).write_bytes, read)
print(json.dumps(found))
"""


@pytest.mark.parametrize("count, seed", BUDGETS)
def test_damaged_arrayrecord_shards_load_or_name_the_file(tmp_path, count, seed):
    here = Path(__file__).resolve().parent
    result = subprocess.run([sys.executable, "-c", CHILD, str(here), str(tmp_path), str(count), str(seed),
                             json.dumps(TEXTS)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"the reader process died ({result.returncode}): {result.stderr[-3000:]}"
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not found, "\n".join(found[:5])
