"""The data-source registry: every source registered and complete, duplicates and unknown names refused."""

import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_corpus
from seqmodels.config import ConfigError, DataConfig
from seqmodels.config_io import load_config
from seqmodels.data import (FIELDS, DataError, DataSource, describe_source, get_source, load_documents,
                            make_eval_batches, make_train_dataset, register_source, required_vocab_size, source_names)
from seqmodels.data.builders.prepare import prepare_shards

SEQ_LEN, BATCH = 24, 2
ROW_TOKENS = {"ruler": 399}  # sources whose shortest row is longer (RULER's template and needle: 367 bytes)


def tiny_config(name: str, tmp_path: Path) -> DataConfig:
    """A small configuration each registered source can make batches from (a new source adds its own)."""
    corpus = write_corpus(tmp_path / "corpus", num_files=8)
    if name == "arrayrecord":
        prepare_shards(str(corpus / "*.txt"), str(tmp_path / "shards"), 2)
    texts = [path.read_text() for path in sorted(corpus.glob("*.txt"))]
    if name == "jsonl":
        (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    if name == "token_ids":
        from seqmodels.data.builders.token_shards import write_token_shards
        write_token_shards(texts, str(tmp_path / "ids"), 2, "byte")
    if name == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": texts}), str(tmp_path / "docs.parquet"))
    overrides = {
        "stdlib": ["data.max_documents=20", "data.heldout_fraction=0.3"],
        "text_files": [f"data.path={corpus / '*.txt'}", "data.heldout_fraction=0.3"],
        "arrayrecord": [f"data.path={tmp_path / 'shards' / '*.array_record'}", "data.heldout_fraction=0.3"],
        "jsonl": [f"data.path={tmp_path / 'docs.jsonl'}", "data.heldout_fraction=0.3"],
        "parquet": [f"data.path={tmp_path / 'docs.parquet'}", "data.heldout_fraction=0.3"],
        "token_ids": [f"data.path={tmp_path / 'ids' / '*.array_record'}", "data.heldout_fraction=0.3"],
        "mqar": ["data.synthetic.num_pairs=4"],
        "selective_copy": ["data.synthetic.num_copy_tokens=4"],
        "needle": [],
        "ruler": [],
        "cfl": ["data.cfl.languages=[dyck1]", "data.cfl.max_length=8"],
    }
    assert name in overrides, f"data source {name!r} has no tiny configuration in this test; add one"
    seq_len = ROW_TOKENS.get(name, SEQ_LEN)
    return load_config(None, [f"data.source={name}", f"data.seq_len={seq_len}", *overrides[name]]).data


def test_the_sources_of_every_module_are_registered():
    assert set(source_names()) >= {"stdlib", "text_files", "arrayrecord", "jsonl", "parquet", "token_ids", "mqar", "selective_copy", "needle", "ruler", "cfl"}


def test_a_source_module_imported_first_still_finds_every_source_registered():
    # Importing one source module directly registers the package's other sources before its own.
    code = ("import seqmodels.data.sources.needle as needle; from seqmodels.data.sources import source_names, get_source; "
            "print(','.join(source_names())); print(get_source('needle').train is needle.needle_train_dataset)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, same = result.stdout.split()
    assert names.split(",") == list(source_names()) and same == "True"


def test_the_registry_docstring_lists_every_module_and_every_source():
    import seqmodels.data.sources as package

    rows = {line.split()[0]: line.split("(")[0].split()[1:] for line in package.__doc__.splitlines()
            if line.startswith("    ") and line.split()[0].endswith(".py")}
    modules = {f"{info.name}.py" for info in pkgutil.iter_modules(package.__path__)}
    assert set(rows) == modules, "a module of seqmodels/data/sources/ is missing from the registry's docstring table"
    listed = sorted(name.rstrip(",") for names in rows.values() for name in names)
    assert listed == sorted(source_names())


@pytest.mark.parametrize("name", source_names())
def test_every_registered_source_is_complete_and_makes_batches_of_the_shared_format(name, tmp_path):
    source = get_source(name)
    assert isinstance(source, DataSource)
    for hook in (source.train, source.eval, source.vocab_size, source.describe, source.check):
        assert callable(hook), f"{name}: {hook!r} is not callable"
    cfg = tiny_config(name, tmp_path)
    inspect.signature(source.train).bind(cfg, batch_size=BATCH, process_index=0, process_count=1)
    inspect.signature(source.eval).bind(cfg, batch_size=BATCH, max_batches=1)
    vocab = required_vocab_size(cfg)
    assert isinstance(vocab, int) and vocab >= 2
    line = describe_source(cfg)
    assert isinstance(line, str) and line
    train = next(iter(make_train_dataset(cfg, batch_size=BATCH)))
    evaluation = make_eval_batches(cfg, batch_size=BATCH, max_batches=1)
    assert len(evaluation) == 1
    assert set(train) == set(FIELDS)
    # A corpus's held-out batches (documents of text or of token ids) also say which held-out document each
    # target token is from.
    corpus = source.documents is not None or name == "token_ids"
    assert set(evaluation[0]) == set(FIELDS) | ({"documents"} if corpus else set())
    if corpus:
        documents = evaluation[0]["documents"]
        assert documents.dtype == np.int32 and documents.shape == evaluation[0]["inputs"].shape
        assert np.array_equal(documents >= 0, evaluation[0]["loss_mask"] > 0)
    for batch in (train, evaluation[0]):
        assert {batch[f].shape[0] for f in FIELDS} == {BATCH}
        assert len({batch[f].shape for f in FIELDS}) == 1 and batch["inputs"].shape[1] <= ROW_TOKENS.get(name, SEQ_LEN)
        for tokens in (batch["inputs"], batch["targets"]):
            assert tokens.dtype == np.int32 and 0 <= tokens.min() and tokens.max() < vocab
        assert batch["loss_mask"].dtype == np.float32 and batch["loss_mask"].sum() > 0


def test_a_name_is_registered_once_and_the_first_entry_stays():
    first = get_source("stdlib")
    other = DataSource(train=first.train, eval=first.eval, vocab_size=lambda cfg: 7, describe=first.describe)
    with pytest.raises(ValueError, match="data source 'stdlib' is registered twice"):
        register_source("stdlib", other)
    assert get_source("stdlib") is first
    with pytest.raises(TypeError, match="must be a DataSource"):
        register_source("not_an_entry", object())
    assert "not_an_entry" not in source_names()


def test_an_unknown_source_is_a_config_error_naming_the_known_ones():
    cfg = load_config(None, ["data.source=webdataset"]).data
    calls = (lambda: make_train_dataset(cfg, batch_size=2), lambda: make_eval_batches(cfg, batch_size=2, max_batches=1),
             lambda: required_vocab_size(cfg), lambda: describe_source(cfg), lambda: load_documents(cfg))
    for call in calls:
        with pytest.raises(ConfigError, match=r"data\.source: unknown source 'webdataset'; known sources: ") as error:
            call()
        assert all(name in str(error.value) for name in source_names())


def test_a_source_reading_files_needs_data_path_before_it_reads():
    for name in ("text_files", "arrayrecord", "jsonl", "parquet", "token_ids"):
        with pytest.raises(ConfigError, match=f"data.path: data.source={name} needs data.path"):
            required_vocab_size(DataConfig(source=name))
        with pytest.raises(ConfigError, match="needs data.path"):
            make_train_dataset(DataConfig(source=name), batch_size=2)


def test_load_documents_of_a_generated_source_names_the_corpora():
    with pytest.raises(DataError, match=r"'mqar' is generated, not a document corpus; corpora: arrayrecord, jsonl, parquet, stdlib, text_files"):
        load_documents(DataConfig(source="mqar"))


@pytest.mark.slow
def test_every_config_file_names_a_registered_source():
    # configs/sweeps/ holds sweep files of ablate.py, not run configs (tests/test_ablate.py checks them)
    files = sorted(p for p in Path("configs").glob("**/*.yaml") if p.parts[1] != "sweeps")
    assert files, "configs/ holds no YAML"
    from seqmodels.hf.base import prepare_base
    for path in files:
        prepare_base(path)  # an AHN config's tokenizer is its base's: converted on first use, as train.py does
        assert load_config(path).data.source in source_names(), path
