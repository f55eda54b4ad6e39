"""--force replaces an earlier export only: never a run, a checkpoint, the repository or the working directory."""

import os
from pathlib import Path

import pytest

import export as export_entry
from seqmodels.config import Config
from seqmodels.config_io import save_config
from seqmodels.errors import HFFormatError
from seqmodels.hf.output_dir import REPOSITORY, check_new_directory, write_new_directory


def _tree(directory: Path) -> dict:
    return {p.relative_to(directory): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


def _export_like(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"old")
    return directory


def _fake_run(directory: Path) -> Path:
    """A run directory as eval/export see one: its config.yaml and a checkpoint step folder."""
    directory.mkdir(parents=True)
    save_config(Config(), directory / "config.yaml")
    (directory / "checkpoints" / "3").mkdir(parents=True)
    (directory / "checkpoints" / "3" / "_CHECKPOINT_METADATA").write_text("{}")
    return directory


def _write(staging: Path) -> None:
    (staging / "config.json").write_text('{"new": true}')


def test_force_replaces_an_earlier_export_and_leaves_no_staging(tmp_path):
    out = _export_like(tmp_path / "hf")
    assert write_new_directory(out, _write, force=True) == out.resolve()
    assert _tree(out) == {Path("config.json"): b'{"new": true}'}
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


@pytest.mark.parametrize("layout", ["run", "runs_parent", "nested_checkpoint"])
def test_force_refuses_a_directory_holding_a_run_or_a_checkpoint(tmp_path, layout):
    if layout == "run":
        target = _fake_run(tmp_path / "runs" / "x")
    elif layout == "runs_parent":
        _fake_run(tmp_path / "runs" / "x")
        target = tmp_path / "runs"
    else:
        target = _export_like(tmp_path / "hf")
        (target / "deep" / "orbax").mkdir(parents=True)
        (target / "deep" / "orbax" / "_CHECKPOINT_METADATA").write_text("{}")
    before = _tree(tmp_path)
    with pytest.raises(HFFormatError, match="--force refuses to replace it"):
        write_new_directory(target, _write, force=True)
    assert _tree(tmp_path) == before  # nothing deleted, no staging folder


@pytest.mark.parametrize("which", ["cwd_dot", "cwd_parent", "repository", "repository_parent"])
def test_force_refuses_the_working_directory_and_the_repository(tmp_path, monkeypatch, which):
    work = _export_like(tmp_path / "work" / "inner")
    monkeypatch.chdir(work)
    target = {"cwd_dot": Path("."), "cwd_parent": Path(".."), "repository": REPOSITORY,
              "repository_parent": REPOSITORY.parent}[which]
    before = _tree(tmp_path)
    with pytest.raises(HFFormatError, match="--force refuses"):
        check_new_directory(target, force=True)
    assert _tree(tmp_path) == before


def test_a_failed_write_leaves_the_old_export_and_no_staging(tmp_path):
    out = _export_like(tmp_path / "hf")

    def failing(staging: Path) -> None:
        (staging / "partial").write_text("x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_new_directory(out, failing, force=True)
    assert _tree(out) == {Path("config.json"): b"{}", Path("model.safetensors"): b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


@pytest.mark.parametrize("out", ["same", "parent", "dot"])
def test_export_py_force_onto_a_run_is_an_error_that_deletes_nothing(tmp_path, monkeypatch, capsys, out):
    run = _fake_run(tmp_path / "runs" / "x")
    monkeypatch.chdir(tmp_path)
    target = {"same": "runs/x", "parent": "runs", "dot": "."}[out]
    before = _tree(tmp_path)
    assert export_entry.main(["--run", "runs/x", "--out", target, "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--force refuses to replace it" in err
    assert _tree(tmp_path) == before and run.is_dir()
    assert not [p for p in os.listdir(tmp_path.parent) if p.startswith(f".{tmp_path.name}.")]
