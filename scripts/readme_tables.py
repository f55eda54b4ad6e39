"""Regenerate the README tables that quote committed results files, from those files.

A README table generated here sits between two marker lines naming it and its source:

    <!-- table NAME: scripts/readme_tables.py from FILE -->
    | ... |
    <!-- /table NAME -->

``python scripts/readme_tables.py`` rewrites every such block from its file; ``--check`` changes
nothing and exits 1 naming each block that differs from what its file gives (the test suite runs it).
Each table's generator (``readme_memory.py``, ``readme_ahn.py``, ``readme_cfl.py``, ``readme_benchmarks.py``,
beside this script; shared formatting in ``readme_format.py``) says which fields of the file each column is.
"""

from __future__ import annotations

import argparse
import re
import sys

from readme_benchmarks import (
    ANCHOR_FILES, COMPILATION_CACHE, PARITY, TPU_AOT, anchors, compilation_cache, export_parity, export_parity_looped,
    tpu_aot,
)
from readme_cfl import (
    CFL, CFL_BATCH128, CFL_BATCH256, CFL_CONTINUED, CFL_CONTINUED_HELDOUT, CFL_HELDOUT, CFL_HELDOUT_BATCH256,
    CFL_LENGTHS_TO_12, CFL_RECIPES, cfl_batch128, cfl_batch256, cfl_continued, cfl_continued_heldout, cfl_grid,
    cfl_heldout, cfl_heldout_batch256, cfl_lengths_to_12, cfl_long_width128, cfl_long_width64, cfl_recipes,
)
from readme_ahn import (
    AHN_PAPER_EVALS, AHN_RULER, AHN_RULER_8K_MODES, AHN_RULER_MODES, ahn_loss, ahn_paper_gap, ahn_paper_loss, ahn_ruler,
    ahn_ruler_8k,
)
from readme_memory import (
    GRANULARITY, GRANULARITY_SEEDS, NEEDLE, NEEDLE_ABLATIONS, NEEDLE_BEFORE, NEEDLE_CORRECTED, NEEDLE_ETA_CURRENT,
    NEEDLE_ETA_SWEEP, RECALL, RECALL_ETA, RULER_SWEEP, RULER_TASK_BPE, memory_sweep, needle_ablations, needle_before,
    needle_corrected, needle_eta_current, needle_eta_sweep, needle_granularity, recall_atlas, recall_atlas_corrected,
    recall_atlas_update, recall_eta, recall_granularity, recall_grid, recall_grid_corrected, recall_ns_scope,
    ruler_sweep, ruler_task_bpe,
)
import readme_format


def _long(*names: str) -> tuple[str, ...]:
    return tuple(f"{CFL}/long/{name}.json" for name in names)


def _granularity(root: str, name: str) -> tuple[str, ...]:
    return tuple(f"{root}/{run}_seed{seed}/{name}" for _, run in GRANULARITY for seed in GRANULARITY_SEEDS)


# name: (README, the results files it is generated from, generator)
TABLES = {
    "memory-sweep": ("results/sweeps/memory/README.md", ("results/sweeps/memory/results.json",), memory_sweep),
    "ahn-loss": ("experiments/ahn/README.md", ("experiments/ahn/results/ahn.json",), ahn_loss),
    "ahn-paper-loss": ("experiments/ahn/README.md", tuple(f"{AHN_RULER}/{path}" for path in AHN_PAPER_EVALS.values()),
                       ahn_paper_loss),
    "ahn-paper-gap": ("experiments/ahn/README.md", tuple(f"{AHN_RULER}/{path}" for path in AHN_PAPER_EVALS.values()),
                      ahn_paper_gap),
    "ahn-ruler": ("experiments/ahn/README.md", tuple(f"{AHN_RULER}/ruler_{mode}.json" for mode in AHN_RULER_MODES),
                  ahn_ruler),
    "ahn-ruler-8k": ("experiments/ahn/README.md", tuple(f"{AHN_RULER}/ruler8k_{mode}.json" for mode in AHN_RULER_8K_MODES),
                     ahn_ruler_8k),
    "ruler-sweep": ("experiments/ruler/README.md", (RULER_SWEEP,), ruler_sweep),
    "ruler-task-bpe": ("experiments/ruler/README.md", (RULER_TASK_BPE,), ruler_task_bpe),
    "cfl-grid": ("experiments/cfl/README.md", (f"{CFL}/grid/cfl.json",), cfl_grid),
    "cfl-long-width64": ("experiments/cfl/README.md", _long("dyck2_bfvp", "marked_palindrome_dyck1"), cfl_long_width64),
    "cfl-long-width128": ("experiments/cfl/README.md", _long("dyck2_d128", "marked_palindrome_d128"),
                          cfl_long_width128),
    "cfl-recipes": ("experiments/cfl/README.md", _long(*CFL_RECIPES), cfl_recipes),
    "cfl-batch128": ("experiments/cfl/README.md", _long(*CFL_BATCH128), cfl_batch128),
    "cfl-lengths-to-12": ("experiments/cfl/README.md", _long(*CFL_LENGTHS_TO_12), cfl_lengths_to_12),
    "cfl-heldout": ("experiments/cfl/README.md", _long(*(f"heldout/{name}" for _, name in CFL_HELDOUT)), cfl_heldout),
    "cfl-batch256": ("experiments/cfl/README.md", _long(*(name for name, _ in CFL_BATCH256)), cfl_batch256),
    "cfl-heldout-batch256": ("experiments/cfl/README.md", _long(*(f"heldout/{name}" for _, name in CFL_HELDOUT_BATCH256)),
                             cfl_heldout_batch256),
    "cfl-continued": ("experiments/cfl/README.md", _long("bfvp_batch256_loops2_sinusoidal_4k", *(
        f"bfvp_continued_{step}" for step, _ in CFL_CONTINUED)), cfl_continued),
    "cfl-continued-heldout": ("experiments/cfl/README.md", _long(*(f"heldout/{name}" for _, name in CFL_CONTINUED_HELDOUT)),
                              cfl_continued_heldout),
    **{name: ("experiments/needle/README.md", tuple(sorted({f"{NEEDLE}/{path}" for _, path, _ in rows})), generate)
       for name, rows, generate in (("needle-eta-sweep", NEEDLE_ETA_SWEEP, needle_eta_sweep),
                                    ("needle-corrected", NEEDLE_CORRECTED, needle_corrected),
                                    ("needle-ablations", NEEDLE_ABLATIONS, needle_ablations),
                                    ("needle-eta-current", NEEDLE_ETA_CURRENT, needle_eta_current),
                                    ("needle-before", NEEDLE_BEFORE, needle_before))},
    "needle-granularity": ("experiments/needle/README.md", _granularity(NEEDLE, "needle.json"), needle_granularity),
    "recall-granularity": ("experiments/recall/README.md", _granularity(RECALL, "recall.json"), recall_granularity),
    **{name: ("experiments/recall/README.md", tuple(f"{RECALL}/{run}/recall.json" for run in runs), generate)
       for name, runs, generate in (
           ("recall-grid", ["grid"], recall_grid), ("recall-atlas", ["atlas"], recall_atlas),
           ("recall-grid-corrected", ["grid_corrected", "grid"], recall_grid_corrected),
           ("recall-ns-scope", ["ns_scope", "grid"], recall_ns_scope),
           ("recall-atlas-update", ["atlas_update", "atlas"], recall_atlas_update),
           ("recall-atlas-corrected", ["atlas_corrected", "atlas_corrected_rest", "atlas_update", "atlas"],
            recall_atlas_corrected),
           ("recall-eta", [f"eta_current/eta_{high}" for high in RECALL_ETA if high != "0.05"] + ["atlas_corrected"],
            recall_eta))},
    "tpu-aot": ("benchmarks/results/tpu_aot/README.md", (TPU_AOT,), tpu_aot),
    "anchors": ("benchmarks/anchors/README.md", ANCHOR_FILES, anchors),
    "compilation-cache": ("README.md", (COMPILATION_CACHE,), compilation_cache),
    "export-parity": ("README.md", (PARITY,), export_parity),
    "export-parity-looped": ("README.md", (PARITY,), export_parity_looped),
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- table {re.escape(name)}: [^\n]*-->\n)(.*?)(\n<!-- /table {re.escape(name)} -->)",
                      re.DOTALL)


def committed_table(name: str) -> str:
    """The table ``name`` as its README holds it (between its markers)."""
    readme, _, _ = TABLES[name]
    match = _block(name).search(readme_format.read_text(readme))
    if match is None:
        raise ValueError(f"{readme} has no block '<!-- table {name}: ... -->' ... '<!-- /table {name} -->'")
    return match.group(2)


def marked_tables(text: str) -> list[str]:
    """The names of the table blocks a README text opens."""
    return re.findall(r"<!-- table ([\w-]+): ", text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    parser.add_argument("names", nargs="*", help=f"tables to regenerate (default all: {', '.join(TABLES)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(TABLES))
    if unknown:
        parser.error(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(TABLES)}")
    stale = []
    for name in args.names or list(TABLES):
        readme, sources, generate = TABLES[name]
        table = generate()
        if committed_table(name) == table:
            continue
        stale.append(f"{name} in {readme} (from {', '.join(sources)})")
        if not args.check:
            path = readme_format.ROOT / readme
            path.write_text(_block(name).sub(lambda m: m.group(1) + table + m.group(3), path.read_text(), count=1))
    if stale:
        print(("out of date: " if args.check else "rewrote: ") + "; ".join(stale))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
