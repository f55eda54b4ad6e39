"""Per-chip memory and FLOPs of the train step on TPU topologies, compiled ahead of time on a CPU machine.

    PYTHONPATH=.libtpu python benchmarks/tpu_aot.py                      # -> benchmarks/results/tpu_aot/
    PYTHONPATH=.libtpu python benchmarks/tpu_aot.py --archs transformer,mamba2 --sizes 350m --topologies v5e:2x4
    PYTHONPATH=.libtpu python benchmarks/tpu_aot.py --archs gated_deltanet --sizes 350m --topologies v5e:2x4 \
        --seq-lens 8192,65536 --contexts 1,8 --rows-per-chip 1 --out benchmarks/results/context_memory

Each case is one ``python -m seqmodels.tools.aot`` run (a fresh process) on an architecture's config
with the size's overrides below, by default every model at ``T = 4096``, 2 rows per chip, bfloat16
activations, ``model.remat=full``, ``model.scan_layers=true`` (compile time independent of depth),
AdamW, the batch and parameters sharded over fsdp across all chips, a 32768-token vocabulary. Nothing
runs. ``--seq-lens`` and ``--contexts`` compile every pair (T, C) of the lists: ``mesh.context=C``
splits each row's T tokens over C chips, fsdp takes the remaining chips, and the batch is
``rows-per-chip x chips / C`` rows, so every chip holds ``rows-per-chip x T / C`` tokens. Writes
``tpu_aot.json`` (every report, failures with their error) and ``tpu_aot.md`` (one table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from seqmodels.runs.portable import portable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "tpu_aot"

ARCHS = {  # name -> (config, layers at 350m, layers at 1b)
    "transformer": ("configs/transformer.yaml", "attention", 24, 20),
    "gated_deltanet": ("configs/gated_deltanet.yaml", "gated_deltanet", 24, 20),
    "mamba2": ("configs/mamba2.yaml", "mamba2", 48, 48),
    "muonssm_mamba2": ("configs/muonssm_mamba2.yaml", "muonssm_mamba2", 48, 48),
    "atlas": ("configs/atlas.yaml", "atlas", 24, 20),
}
SIZES = {"350m": dict(d_model=1024, heads=16), "1b": dict(d_model=2048, heads=16)}
COMMON = ["model.vocab_size=32768", "model.compute_dtype=bfloat16", "model.remat=full", "model.scan_layers=true",
          "mesh.data=1", "mesh.fsdp=-1"]


def case_overrides(arch: str, size: str, num_chips: int, *, seq_len: int = 4096, context: int = 1,
                   rows_per_chip: int = 2) -> list[str]:
    """The overrides of one case: ``rows_per_chip x num_chips / context`` rows of ``seq_len`` tokens."""
    if seq_len % context or (rows_per_chip * num_chips) % context:
        raise ValueError(f"mesh.context={context} must divide T={seq_len} and the {rows_per_chip * num_chips} "
                         "rows-per-chip x chips")
    _, mixer, layers_350m, layers_1b = ARCHS[arch]
    layers = layers_350m if size == "350m" else layers_1b
    shape = SIZES[size]
    heads = shape["heads"] if mixer in ("attention",) else shape["d_model"] // 128
    return COMMON + [f"model.max_seq_len={seq_len}", f"data.seq_len={seq_len}", f"mesh.context={context}",
                     f"model.d_model={shape['d_model']}", f"model.num_heads={heads}",
                     f"model.mixers=[{mixer}] * {layers}",
                     f"train.batch_size={rows_per_chip * num_chips // context}"]


def compiler_error(stderr: str) -> str:
    """The last lines of a failed compile's stderr and the compiler's reason, with the machine's paths made
    portable (a traceback names the venv's files; the table is committed)."""
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(("W", "I0"))]
    causes = [line for line in lines if "Check failed" in line or "Error" in line]  # the compiler's reason
    return portable("\n".join((lines[-6:] + causes[-1:]) if causes else lines[-6:]))


def chips(topology: str) -> int:
    dims = topology.split(":")[1].split("x")
    product = 1
    for d in dims:
        product *= int(d)
    return product


def run_case(arch: str, size: str, topology: str, timeout: float, *, seq_len: int = 4096, context: int = 1,
             rows_per_chip: int = 2, out_dir: Path = RESULTS, extra: tuple[str, ...] = ()) -> dict:
    config = ARCHS[arch][0]
    overrides = case_overrides(arch, size, chips(topology), seq_len=seq_len, context=context,
                               rows_per_chip=rows_per_chip) + list(extra)
    out = out_dir / f".{arch}_{size}_{topology.replace(':', '_')}_{seq_len}_{context}.json"
    command = [sys.executable, "-m", "seqmodels.tools.aot", "--topology", topology, "--config", config,
               "--json", str(out), *overrides]
    row = {"arch": arch, "size": size, "topology": topology, "seq_len": seq_len, "context": context,
           "extra_overrides": list(extra),
           "tokens_per_chip": rows_per_chip * seq_len // context,
           "command": portable(" ".join(["python -m seqmodels.tools.aot", *command[3:-len(overrides)],
                                         *map(repr, overrides)]))}
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "TPU_SKIP_MDS_QUERY": "1"})
    except subprocess.TimeoutExpired:
        return {**row, "error": f"compile did not finish in {timeout:.0f} s"}
    if result.returncode != 0:
        return {**row, "error": compiler_error(result.stderr)}
    report = json.loads(out.read_text())
    out.unlink()
    return {**row, **report}


def step_tflops(row: dict) -> str:
    """Training TFLOPs per chip per step: the FLOPs registry's, else XLA's count marked as such (XLA counts
    a while loop's body once, so a scan over layers or chunks is undercounted)."""
    if "model_flops" in row:
        return f"{row['model_flops'] / 1e12:.1f}"
    return f"{row['flops'] / 1e12:.1f} (XLA)"


def markdown(rows: list[dict]) -> str:
    gib = 2.0 ** 30
    lines = ["| arch | size | topology | T | context | tokens / chip | params | per-chip args GiB | outputs GiB | "
             "temps GiB | peak GiB | TFLOPs / chip / step | Mosaic calls | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = f"{r.get('seq_len', 4096)} | {r.get('context', 1)} | {r.get('tokens_per_chip', 2 * 4096)}"
        arch = r["arch"] + (f" ({', '.join(r['extra_overrides'])})" if r.get("extra_overrides") else "")
        if "error" in r:
            lines.append(f"| {arch} | {r['size']} | {r['topology']} | {shape} | failed: "
                         f"{r['error'].splitlines()[-1][:120]} | | | | | | | |")
            continue
        lines.append(f"| {arch} | {r['size']} | {r['topology']} ({r['device_kind']} x {r['num_devices']}) | {shape} | "
                     f"{r['num_params'] / 1e6:.0f}M | {r['argument_bytes'] / gib:.2f} | {r['output_bytes'] / gib:.2f} | "
                     f"{r['temp_bytes'] / gib:.2f} | {r['peak_bytes'] / gib:.2f} | {step_tflops(r)} | "
                     f"{r['mosaic_kernels']} | {r['compile_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--sizes", default="350m,1b")
    parser.add_argument("--topologies", default="v5e:2x4,v5p:2x2x2")
    parser.add_argument("--seq-lens", default="4096", help="comma-separated T per row")
    parser.add_argument("--contexts", default="1", help="comma-separated mesh.context sizes")
    parser.add_argument("--rows-per-chip", type=int, default=2, help="rows per chip before the context split")
    parser.add_argument("--override", action="append", default=[],
                        help="a dotted override added to every case, e.g. model.attention.context_impl=ring")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per compile")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    archs, sizes = args.archs.split(","), args.sizes.split(",")
    unknown = [a for a in archs if a not in ARCHS] + [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown arch or size {unknown}; archs {list(ARCHS)}, sizes {list(SIZES)}")
    seq_lens, contexts = [int(x) for x in args.seq_lens.split(",")], [int(x) for x in args.contexts.split(",")]
    if min(seq_lens + contexts + [args.rows_per_chip]) < 1:
        parser.error("--seq-lens, --contexts and --rows-per-chip must be positive")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    cases = [(topology, size, arch, seq_len, context) for topology in args.topologies.split(",") for size in sizes
             for arch in archs for seq_len in seq_lens for context in contexts]
    unsplittable = []
    for topology, size, arch, seq_len, context in cases:
        try:
            case_overrides(arch, size, chips(topology), seq_len=seq_len, context=context,
                           rows_per_chip=args.rows_per_chip)
        except ValueError:
            unsplittable.append((topology, size, arch, seq_len, context))
    if unsplittable:
        parser.error(f"mesh.context must divide T and rows-per-chip x chips; it does not for (topology, size, arch, "
                     f"T, context) {unsplittable}")
    for topology, size, arch, seq_len, context in cases:
        rows.append(run_case(arch, size, topology, args.timeout, seq_len=seq_len, context=context,
                             rows_per_chip=args.rows_per_chip, out_dir=out, extra=tuple(args.override)))
        status = rows[-1].get("error", "").splitlines()[-1:] or [f"peak {rows[-1]['peak_bytes'] / 2**30:.2f} GiB"]
        print(f"{arch:16s} {size:5s} {topology:10s} T={seq_len:<7d} context={context:<3d} {status[0]}", flush=True)
        (out / "tpu_aot.json").write_text(json.dumps(
            {"command": portable(" ".join(["python benchmarks/tpu_aot.py",
                                           *(argv if argv is not None else sys.argv[1:])])),
             "rows": rows}, indent=2) + "\n")
        (out / "tpu_aot.md").write_text(markdown(rows))
    print(f"wrote {out / 'tpu_aot.json'} and {out / 'tpu_aot.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
