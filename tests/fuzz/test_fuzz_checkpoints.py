"""Fuzzing checkpoints: a truncated or changed file anywhere in the newest step; eval and export's restore
(``seqmodels.runs.load``) falls back to the older step or raises ``CheckpointError``, and writes nothing."""

import random
import shutil

import pytest

import train as train_entry
from conftest import tiny_overrides, write_corpus
from fuzzing import failures, flips, tree_snapshot, truncations
from seqmodels.runs.load import load_run_params


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_checkpoints")
    corpus = str(write_corpus(root / "corpus") / "*.txt")
    run_dir = root / "run"
    assert train_entry.main(tiny_overrides(run_dir, corpus, train__steps=4, checkpoint__every_steps=2,
                                           log__tensorboard=False)) == 0
    return run_dir


@pytest.mark.slow
def test_damaged_files_of_the_newest_step_fall_back_or_name_the_checkpoint(run, tmp_path):
    rng = random.Random(0)
    files = sorted(p.relative_to(run) for p in (run / "checkpoints" / "4").rglob("*") if p.is_file())
    found = []
    for relative in rng.sample(files, min(12, len(files))):
        copy = tmp_path / "run"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run, copy)
        target = copy / relative
        data = target.read_bytes()
        cases = truncations(data, rng, 2) + flips(data, rng, 2) if data else [("empty", b"")]
        before = tree_snapshot(copy)

        def restore():
            _, _, step = load_run_params(copy, warn=lambda message: None)
            assert step in (2, 4)
            assert tree_snapshot(copy) == before  # a reader writes nothing into the run

        found += [f"{relative}: {failure}" for failure in failures(cases, target.write_bytes, restore)]
    assert not found, "\n".join(found[:5])
