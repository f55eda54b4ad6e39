"""python -m seqmodels.data.builders.prepare --tokenizer: token-id shards, read back by data.source=token_ids."""

import json

import numpy as np
import pytest

from seqmodels.config import ConfigError, DataConfig
from seqmodels.data import DataError, make_eval_batches, make_train_dataset
from seqmodels.data.builders.prepare import main as prepare_main
from seqmodels.data.sources.token_ids import token_documents
from seqmodels.data.tokenizers import ByteTokenizer

TEXTS = [f"document {i}: " + "abc " * (i % 9 + 1) for i in range(40)]


@pytest.fixture
def shards(tmp_path):
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS))
    argv = ["--input", str(source), "--tokenizer", "byte", "--output", str(tmp_path / "ids"), "--shards", "4",
            "--workers", "2", "--text-field", "body"]
    assert prepare_main(argv) == 0
    assert prepare_main(argv) == 2, "writing into a directory that already holds shards must fail"
    return str(tmp_path / "ids" / "*.array_record")


@pytest.mark.slow
def test_shards_hold_each_document_s_ids_in_order(shards, tmp_path):
    metadata = json.loads((tmp_path / "ids" / "tokens.json").read_text())
    assert metadata["documents"] == 40 and metadata["dtype"] == "<u2"
    assert metadata["tokens"] == sum(len(t.encode()) for t in TEXTS)
    cfg = DataConfig(source="token_ids", path=shards, heldout_path=shards)
    mine, heldout = token_documents(cfg)
    assert [ByteTokenizer().decode(mine[i]) for i in range(len(mine))] == TEXTS


@pytest.mark.slow
def test_processes_read_disjoint_shards_and_the_split_holds_out_by_hash(shards):
    cfg = DataConfig(source="token_ids", path=shards, heldout_fraction=0.25)
    parts = [token_documents(cfg, process_index=p, process_count=2) for p in range(2)]
    seen = [set(part.identities) for part, _ in parts]
    heldout = set(parts[0][1].identities)
    assert not seen[0] & seen[1] and heldout and not heldout & (seen[0] | seen[1])
    assert len(seen[0] | seen[1] | heldout) == 40
    assert {i.split(":")[0] for i in seen[0]} == {"tokens-00000-of-00004.array_record",
                                                  "tokens-00002-of-00004.array_record"}
    with pytest.raises(DataError, match="4 shards cannot be split among 5 processes"):
        token_documents(cfg, process_index=0, process_count=5)


def test_training_and_eval_batches_frame_documents(shards):
    cfg = DataConfig(source="token_ids", path=shards, heldout_fraction=0.25, seq_len=16)
    batch = next(iter(make_train_dataset(cfg, batch_size=2)))
    assert batch["inputs"].shape == (2, 16) and batch["inputs"].max() < 258
    evaluation = make_eval_batches(cfg, batch_size=2, max_batches=2)
    assert evaluation[0]["inputs"][0, 0] == ByteTokenizer.bos_id
    assert np.all(evaluation[0]["loss_mask"] >= 0)


@pytest.mark.slow
def test_a_different_tokenizer_is_refused(shards, tmp_path):
    (tmp_path / "tok").mkdir()
    from tokenizers import Tokenizer, models, pre_tokenizers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    tokenizer.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    cfg = DataConfig(source="token_ids", path=shards, tokenizer=f"hf:{tmp_path / 'tok'}")
    with pytest.raises(ConfigError, match="were written with byte"):
        token_documents(cfg)
