"""Every README table generated from a committed results file is what scripts/readme_tables.py makes of it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import readme_format  # noqa: E402  (scripts, not a package)
import readme_tables  # noqa: E402


@pytest.mark.parametrize("name", sorted(readme_tables.TABLES))
def test_committed_readme_table_equals_the_one_its_results_file_gives(name):
    readme, sources, generate = readme_tables.TABLES[name]
    assert sources and all((ROOT / source).is_file() for source in sources), sources
    table = generate()
    assert table.count("\n") >= 2  # a header, its rule and at least one row
    assert readme_tables.committed_table(name) == table, (
        f"{readme}'s table {name} differs from {', '.join(sources)}: run python scripts/readme_tables.py {name}")


def test_every_marked_readme_table_is_one_the_script_generates():
    readmes = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    marked = {name: readme for readme in readmes for name in readme_tables.marked_tables((ROOT / readme).read_text())}
    assert set(marked) == set(readme_tables.TABLES)
    assert all(readme_tables.TABLES[name][0] == readme for name, readme in marked.items())


def _floats(value, path=()):
    """The key paths of every float in a JSON value, depth first."""
    if isinstance(value, float):
        yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _floats(item, (*path, key))


def _planted(data, path, value):
    data = json.loads(json.dumps(data))
    inner = data
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return data


def _read(path: Path):
    """A JSON file, or a JSON-lines file as the list of its records."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    return json.loads(path.read_text())


def _write(path: Path, data) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(record) + "\n" for record in data))
    else:
        path.write_text(json.dumps(data))


def _check_fails(name) -> bool:
    try:
        return readme_tables.main(["--check", name]) == 1
    except (AssertionError, KeyError, ValueError, ZeroDivisionError):
        return True  # a generator's own consistency check refused the file


@pytest.mark.parametrize("name", sorted(readme_tables.TABLES))
def test_check_fails_when_a_results_file_changes_a_value_without_the_readme(name, tmp_path, monkeypatch):
    """In a copy of the README and its results files, a value of a results file that the table shows is
    planted with another: ``--check`` passes before and fails after, and leaves the README as it was."""
    readme, sources, generate = readme_tables.TABLES[name]
    for path in (readme, *sources):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    monkeypatch.setattr(readme_format, "ROOT", tmp_path)
    assert readme_tables.main(["--check", name]) == 0
    committed = (tmp_path / readme).read_text()
    for source in sources:
        data = _read(ROOT / source)
        shown = readme_tables.committed_table(name)
        for path in _floats(data):
            original = data
            for key in path:
                original = original[key]
            # plant only values the table can show (to 3 decimals or as a rounded count)
            if f"{original:.3f}" not in shown and f"{original:,.0f}" not in shown:
                continue
            _write(tmp_path / source, _planted(data, path, original + 0.37))
            if _check_fails(name):
                assert (tmp_path / readme).read_text() == committed
                return
        shutil.copy(ROOT / source, tmp_path / source)
    pytest.fail(f"no planted value of {', '.join(sources)} makes --check fail for table {name}")


def test_check_mode_reports_a_stale_table_and_leaves_it(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- table demo: scripts/readme_tables.py from x.json -->\n| a |\n|---|\n| 1 |\n"
                      "<!-- /table demo -->\nafter\n")
    monkeypatch.setattr(readme_format, "ROOT", tmp_path)
    monkeypatch.setattr(readme_tables, "TABLES", {"demo": ("README.md", ("x.json",), lambda: "| a |\n|---|\n| 2 |")})
    before = readme.read_text()
    assert readme_tables.main(["--check"]) == 1 and readme.read_text() == before
    assert readme_tables.main([]) == 0
    assert readme.read_text() == before.replace("| 1 |", "| 2 |")
    assert readme_tables.main(["--check"]) == 0
