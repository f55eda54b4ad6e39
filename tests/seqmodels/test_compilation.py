"""The persistent compilation cache: a second process reads every program back and trains bitwise alike; the
run logs what its compiles cost; '' turns the cache off; a directory that cannot be made is a usage error."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import eval as eval_entry
import train as train_entry
from conftest import tiny_overrides
from seqmodels.compilation import ENVIRONMENT_VARIABLE, use_compilation_cache

ROOT = Path(__file__).resolve().parents[2]
COMPILE_LINE = re.compile(r"compiles: (\d+) program\(s\) in [0-9.]+ s of XLA \((\d+) of (\d+) read back from the "
                          r"persistent cache at (\S+)\)")


@pytest.fixture
def session_cache():
    """Puts this worker's jax back on the suite's cache after a test that moved it."""
    yield
    use_compilation_cache(os.environ[ENVIRONMENT_VARIABLE])


def _train(run_dir, corpus, cache) -> tuple[re.Match, list[dict]]:
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *tiny_overrides(run_dir, corpus, train__steps=3)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, ENVIRONMENT_VARIABLE: str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    found = COMPILE_LINE.search(done.stdout + done.stderr)
    assert found, (done.stdout + done.stderr)[-2000:]
    return found, [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_second_process_reads_every_program_back_and_trains_bitwise_alike(tmp_path, tiny_corpus):
    cache = tmp_path / "xla"
    cold, cold_rows = _train(tmp_path / "cold", tiny_corpus, cache)
    warm, warm_rows = _train(tmp_path / "warm", tiny_corpus, cache)
    programs, served, requested, where = cold.groups()
    assert int(programs) > 0 and served == "0" and requested == programs and where == str(cache)
    assert warm.group(2) == warm.group(3) == warm.group(1) == programs  # every program read back
    assert [row["loss"] for row in warm_rows] == [row["loss"] for row in cold_rows]
    # the first metrics row carries the compile record; later rows do not
    assert cold_rows[0]["cache_served"] == 0 and warm_rows[0]["cache_served"] == int(programs)
    assert warm_rows[0]["compile_seconds"] < cold_rows[0]["compile_seconds"]
    assert "compile_seconds" not in cold_rows[1]


def test_an_empty_setting_compiles_without_a_cache(tmp_path, tiny_corpus, capsys, session_cache):
    run_dir = tmp_path / "run"
    assert train_entry.main(tiny_overrides(run_dir, tiny_corpus, train__steps=1, train__compilation_cache="")) == 0
    out = capsys.readouterr().out
    assert "the persistent compilation cache is off" in out and "read back" not in out


def test_a_cache_directory_that_cannot_be_made_is_a_usage_error_before_anything_is_written(
        tmp_path, tiny_corpus, capsys, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    run_dir = tmp_path / "run"
    assert train_entry.main(tiny_overrides(run_dir, tiny_corpus, train__compilation_cache=str(blocker / "xla"))) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train.compilation_cache: cannot create the compilation cache directory")
    assert str(blocker / "xla") in err and "Traceback" not in err and not run_dir.exists()
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(blocker / "xla"))
    assert eval_entry.main(["--run", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot create the compilation cache directory") and ENVIRONMENT_VARIABLE in err


def test_the_setting_defaults_to_the_environment_and_a_resume_may_change_it(monkeypatch, tmp_path):
    from seqmodels.config_io import load_config
    from seqmodels.training.resume import setting_differences
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(tmp_path / "here"))
    saved = load_config(None, [])
    assert saved.train.compilation_cache == str(tmp_path / "here")
    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    current = load_config(None, [])
    assert current.train.compilation_cache == "~/.cache/seqmodels/xla"
    assert setting_differences(saved, current) == {}  # where programs are cached never stops a resume
