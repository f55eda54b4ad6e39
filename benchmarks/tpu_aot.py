"""Per-chip memory and FLOPs of the train step on TPU topologies, compiled ahead of time on a CPU machine.

    PYTHONPATH=.libtpu python benchmarks/tpu_aot.py                      # -> benchmarks/results/tpu_aot/
    PYTHONPATH=.libtpu python benchmarks/tpu_aot.py --archs transformer,mamba2 --sizes 350m --topologies v5e:2x4

Each case is one ``python -m seqmodels.tools.aot`` run (a fresh process) on an architecture's config
with the size's overrides below, every model at ``T = 4096``, 2 rows per chip, bfloat16 activations,
``model.remat=full``, ``model.scan_layers=true`` (compile time independent of depth), AdamW, the batch
and parameters sharded over fsdp across all chips, a 32768-token vocabulary. Nothing runs. Writes
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
COMMON = ["model.vocab_size=32768", "model.max_seq_len=4096", "data.seq_len=4096", "model.compute_dtype=bfloat16",
          "model.remat=full", "model.scan_layers=true", "mesh.data=1", "mesh.fsdp=-1"]


def case_overrides(arch: str, size: str, num_chips: int) -> list[str]:
    _, mixer, layers_350m, layers_1b = ARCHS[arch]
    layers = layers_350m if size == "350m" else layers_1b
    shape = SIZES[size]
    heads = shape["heads"] if mixer in ("attention",) else shape["d_model"] // 128
    return COMMON + [f"model.d_model={shape['d_model']}", f"model.num_heads={heads}",
                     f"model.mixers=[{mixer}] * {layers}", f"train.batch_size={2 * num_chips}"]


def chips(topology: str) -> int:
    dims = topology.split(":")[1].split("x")
    product = 1
    for d in dims:
        product *= int(d)
    return product


def run_case(arch: str, size: str, topology: str, timeout: float) -> dict:
    config = ARCHS[arch][0]
    overrides = case_overrides(arch, size, chips(topology))
    out = RESULTS / f".{arch}_{size}_{topology.replace(':', '_')}.json"
    command = [sys.executable, "-m", "seqmodels.tools.aot", "--topology", topology, "--config", config,
               "--json", str(out), *overrides]
    row = {"arch": arch, "size": size, "topology": topology,
           "command": portable(" ".join(["python -m seqmodels.tools.aot", *command[3:-len(overrides)],
                                         *map(repr, overrides)]))}
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "TPU_SKIP_MDS_QUERY": "1"})
    except subprocess.TimeoutExpired:
        return {**row, "error": f"compile did not finish in {timeout:.0f} s"}
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("W", "I0"))]
        causes = [line for line in lines if "Check failed" in line or "Error" in line]  # the compiler's reason
        return {**row, "error": "\n".join((lines[-6:] + causes[-1:]) if causes else lines[-6:])}
    report = json.loads(out.read_text())
    out.unlink()
    return {**row, **report}


def markdown(rows: list[dict]) -> str:
    gib = 2.0 ** 30
    lines = ["| arch | size | topology | params | per-chip args GiB | outputs GiB | temps GiB | peak GiB | "
             "TFLOPs / chip / step | Mosaic calls | compile s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['arch']} | {r['size']} | {r['topology']} | failed: {r['error'].splitlines()[-1][:120]} "
                         "| | | | | | | |")
            continue
        lines.append(f"| {r['arch']} | {r['size']} | {r['topology']} ({r['device_kind']} x {r['num_devices']}) | "
                     f"{r['num_params'] / 1e6:.0f}M | {r['argument_bytes'] / gib:.2f} | {r['output_bytes'] / gib:.2f} | "
                     f"{r['temp_bytes'] / gib:.2f} | {r['peak_bytes'] / gib:.2f} | {r['flops'] / 1e12:.1f} | "
                     f"{r['mosaic_kernels']} | {r['compile_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--sizes", default="350m,1b")
    parser.add_argument("--topologies", default="v5e:2x4,v5p:2x2x2")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per compile")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    archs, sizes = args.archs.split(","), args.sizes.split(",")
    unknown = [a for a in archs if a not in ARCHS] + [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown arch or size {unknown}; archs {list(ARCHS)}, sizes {list(SIZES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for topology in args.topologies.split(","):
        for size in sizes:
            for arch in archs:
                rows.append(run_case(arch, size, topology, args.timeout))
                status = rows[-1].get("error", "").splitlines()[-1:] or [f"peak {rows[-1]['peak_bytes'] / 2**30:.2f} GiB"]
                print(f"{arch:16s} {size:5s} {topology:10s} {status[0]}", flush=True)
                (out / "tpu_aot.json").write_text(json.dumps(
                    {"command": portable(" ".join(["python benchmarks/tpu_aot.py",
                                                   *(argv if argv is not None else sys.argv[1:])])),
                     "rows": rows}, indent=2) + "\n")
                (out / "tpu_aot.md").write_text(markdown(rows))
    print(f"wrote {out / 'tpu_aot.json'} and {out / 'tpu_aot.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
