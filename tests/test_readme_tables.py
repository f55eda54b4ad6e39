"""Every README table generated from a committed results file is what scripts/readme_tables.py makes of it."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import readme_tables  # noqa: E402  (a script, not a package)


@pytest.mark.parametrize("name", sorted(readme_tables.TABLES))
def test_committed_readme_table_equals_the_one_its_results_file_gives(name):
    readme, source, generate = readme_tables.TABLES[name]
    assert (ROOT / source).is_file(), source
    table = generate()
    assert table.count("\n") >= 2  # a header, its rule and at least one row
    assert readme_tables.committed_table(name) == table, (
        f"{readme}'s table {name} differs from {source}: run python scripts/readme_tables.py {name}")


def test_every_marked_readme_table_is_one_the_script_generates():
    readmes = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    marked = {name: readme for readme in readmes for name in readme_tables.marked_tables((ROOT / readme).read_text())}
    assert set(marked) == set(readme_tables.TABLES)
    assert all(readme_tables.TABLES[name][0] == readme for name, readme in marked.items())


def test_check_mode_reports_a_stale_table_and_leaves_it(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- table demo: scripts/readme_tables.py from x.json -->\n| a |\n|---|\n| 1 |\n"
                      "<!-- /table demo -->\nafter\n")
    monkeypatch.setattr(readme_tables, "ROOT", tmp_path)
    monkeypatch.setattr(readme_tables, "TABLES", {"demo": ("README.md", "x.json", lambda: "| a |\n|---|\n| 2 |")})
    before = readme.read_text()
    assert readme_tables.main(["--check"]) == 1 and readme.read_text() == before
    assert readme_tables.main([]) == 0
    assert readme.read_text() == before.replace("| 1 |", "| 2 |")
    assert readme_tables.main(["--check"]) == 0
