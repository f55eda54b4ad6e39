"""The house's import rules (ARCHITECTURE.md), computed on the source: every import of ``seqmodels/`` and
``pallas_kernels/``, lazy imports inside functions included.

- no cycle of files (a package's ``__init__`` importing its own submodules is not one);
- no two folders of ``seqmodels/`` importing each other;
- nothing reaches up: ``layers`` < ``mixers`` < ``models`` < the floors above; the model floors import
  nothing from ``training``, ``evaluation``, ``sweeps``, ``hf``, ``runs``, ``tools`` or ``data``;
  ``pallas_kernels`` imports no ``seqmodels``;
- ``training/loop.py`` names no model kind.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("seqmodels", "pallas_kernels")

# Each folder of seqmodels/ may import only folders of a lower floor (or beside it: data/ and optim/ are
# used by the floors above the models and import none of them). A folder missing here fails the test, so
# a new one is placed deliberately.
FLOORS = {
    "layers": 0, "mixers": 1, "models": 2,
    "optim": 1, "data": 1,
    "runs": 3, "hf": 4, "evaluation": 5, "training": 5, "sweeps": 6, "tools": 7,
}
MODEL_FLOORS = ("layers", "mixers", "models")
NEVER_FROM_MODEL_FLOORS = ("training", "evaluation", "sweeps", "hf", "runs", "tools", "data")


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the given packages of ``root``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _resolve(target: str, modules: dict) -> str | None:
    """The longest known module that ``target`` (a module, or a name inside one) names."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (top level or inside functions)."""
    modules = module_files(root, packages)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] in packages and (found := _resolve(target, modules)) and found != name:
                    imported.add(found)
        graph[name] = imported
    return graph


def _own_package(a: str, b: str) -> bool:
    return a.startswith(b + ".") or b.startswith(a + ".")


def file_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one file (Tarjan), ignoring a package and its own modules."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if _own_package(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                cycles.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def folder(module: str) -> str | None:
    """``seqmodels.<folder>.…`` -> folder; top-level files of ``seqmodels/`` and other packages -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "seqmodels" and len(parts) > 2 else None


def folder_edges(graph):
    return {(folder(a), folder(b), a, b) for a, outs in graph.items() for b in outs
            if folder(a) and folder(b) and folder(a) != folder(b)}


def violations(graph: dict[str, set[str]], floors=FLOORS) -> list[str]:
    found = [f"file cycle: {' -> '.join(cycle)}" for cycle in file_cycles(graph)]
    edges = folder_edges(graph)
    pairs = {(fa, fb) for fa, fb, _, _ in edges}
    found += [f"folders import each other: {fa} <-> {fb}" for fa, fb in sorted(pairs) if fa < fb and (fb, fa) in pairs]
    for fa, fb, a, b in sorted(edges):
        for name in (fa, fb):
            if name not in floors:
                found.append(f"folder seqmodels/{name}/ has no floor in FLOORS (imported by or importing {a} -> {b})")
        if fa in floors and fb in floors and floors[fb] >= floors[fa]:
            found.append(f"upward import: {a} -> {b} ({fa} is floor {floors[fa]}, {fb} is floor {floors[fb]})")
        if fa in MODEL_FLOORS and fb in NEVER_FROM_MODEL_FLOORS:
            found.append(f"model floor imports {fb}/: {a} -> {b}")
    for a, outs in graph.items():
        if a.split(".")[0] == "pallas_kernels":
            found += [f"pallas_kernels imports seqmodels: {a} -> {b}" for b in sorted(outs) if b.startswith("seqmodels")]
    return sorted(set(found))


def test_the_house_has_no_cycle_no_folder_pair_and_no_upward_import():
    graph = import_graph(ROOT)
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300, "the graph lost most of the project"
    assert violations(graph) == []


def test_training_loop_names_no_model_kind():
    from seqmodels.models.kinds import KINDS

    tree = ast.parse((ROOT / "seqmodels/training/loop.py").read_text())
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert len(KINDS) >= 3
    assert not strings & set(KINDS), strings & set(KINDS)
    assert not {"init_from", "ahn", "looped"} & names


def _plant(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"seqmodels/models/a.py": "def f():\n    from seqmodels.models import b\n",
          "seqmodels/models/b.py": "from . import a\n"}, "file cycle: seqmodels.models.a -> seqmodels.models.b"),
        ({"seqmodels/mixers/m.py": "from seqmodels.models import lm\n",
          "seqmodels/models/lm.py": "import seqmodels.mixers.m\n"}, "folders import each other: mixers <-> models"),
        ({"seqmodels/layers/x.py": "from ..mixers.m import y\n",
          "seqmodels/mixers/m.py": "y = 1\n"}, "upward import: seqmodels.layers.x -> seqmodels.mixers.m"),
        ({"seqmodels/models/lm.py": "def load():\n    from seqmodels.hf import base\n",
          "seqmodels/hf/base.py": ""}, "model floor imports hf/: seqmodels.models.lm -> seqmodels.hf.base"),
        ({"pallas_kernels/op/__init__.py": "from seqmodels.layers import x\n",
          "seqmodels/layers/x.py": ""}, "pallas_kernels imports seqmodels: pallas_kernels.op -> seqmodels.layers.x"),
        ({"seqmodels/attic/old.py": "from seqmodels.layers import x\n",
          "seqmodels/layers/x.py": ""}, "folder seqmodels/attic/ has no floor"),
    ],
    ids=["cycle", "folder-pair", "upward", "model-floor-io", "kernels", "unplaced-folder"],
)
def test_the_checker_finds_each_kind_of_violation_planted_in_a_small_tree(tmp_path, files, expected):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    found = violations(import_graph(_plant(tmp_path, files)))
    assert any(line.startswith(expected) for line in found), found


def test_a_package_importing_its_own_modules_is_not_a_cycle(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    _plant(tmp_path, {"seqmodels/mixers/__init__.py": "from . import gdn\n",
                      "seqmodels/mixers/gdn.py": "from seqmodels.mixers import registry\n",
                      "seqmodels/mixers/registry.py": ""})
    assert violations(import_graph(tmp_path)) == []
