"""Committed files name no absolute path of a machine; results writers record paths relative to the repository."""

import re
import subprocess
from pathlib import Path

import pytest

from seqmodels.runs.portable import REPOSITORY, portable, portable_path

ROOT = Path(__file__).resolve().parents[3]
# Absolute prefixes of the machines results were made on (assembled so this file does not match itself).
MACHINE_PREFIXES = [f"/{name}/" for name in ("work", "tmp", "home", "check", "root", "Users", "scratch")]
_MACHINE_PATH = re.compile("(?:^|[\\s\"'`=(\\[,:])(" + "|".join(map(re.escape, MACHINE_PREFIXES)) + ")")


def test_no_committed_file_holds_an_absolute_path_of_a_machine():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in filter(None, files.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # images and other binary files
        for number, line in enumerate(text.splitlines(), 1):
            if _MACHINE_PATH.search(line):
                found.append(f"{name}:{number}: {line.strip()[:160]}")
    assert len(files) > 100 and not found, "\n".join(found[:40])


def test_paths_inside_the_repository_become_relative_and_others_their_last_component(tmp_path):
    root = tmp_path / "repo"
    assert portable_path(str(root / ".venv" / "bin" / "python"), root) == ".venv/bin/python"
    assert portable_path(str(root), root) == "."
    assert portable_path(str(tmp_path / "scratch" / "aot_a"), root) == "aot_a"
    assert portable_path("configs/atlas.yaml", root) == "configs/atlas.yaml"
    command = f"python run.py --out {tmp_path}/out_a --json={root}/r/x.json data.path={root}/corpus/*.txt"
    assert portable(command, root) == "python run.py --out out_a --json=r/x.json data.path=corpus/*.txt"
    document = {"command": [f"{root}/.venv/bin/python", "train.py"], "settings": {"out": f"{tmp_path}/e"}, "n": 3}
    assert portable(document, root) == {"command": [".venv/bin/python", "train.py"], "settings": {"out": "e"}, "n": 3}
    assert REPOSITORY == ROOT


def test_portable_path_refuses_what_is_not_a_string():
    with pytest.raises(TypeError, match="must be a str"):
        portable_path(Path("/a/b"))
