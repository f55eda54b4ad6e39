"""One GPU benchmark suite: kernels, Newton-Schulz, attention over packed rows, the train step of every mixer.

    python benchmarks/gpu_suite.py --out results/gpu/            # one H200: gpu_suite.json + gpu_suite.md
    python benchmarks/gpu_suite.py --small --out scratch/gpu_suite  # CPU smoke run (CI): tiny shapes
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python benchmarks/gpu_suite.py --small \
        --out scratch/gpu_suite                                     # ... with a simulated 4-device node
    python benchmarks/gpu_suite.py --out results/gpu/atlas --sections atlas_memory  # one section (--sections a,b)

Sections, each measured in this run (medians of ``--repeats`` calls after a warm-up):

- ``kernels``: every case of ``benchmarks/kernel_cases.py`` at the H200 anchor shapes (linear_scan,
  chunk_gla, gated_delta_rule, newton_schulz: every impl side by side, forward and forward+backward),
  with Newton-Schulz also at 4096 x 11008; each record carries the anchor numbers measured for the same
  op and shape (``benchmarks/anchors/``: flash-linear-attention's Triton kernels, PyTorch's Newton-Schulz)
  as ``reference`` lines, and its ratio to the case's first function.
- ``packed_attention``: causal attention over rows packed with several documents (segment ids),
  B8 T4096 H16 D128 bf16, through ``attend_rows`` with each ``model.attention.implementation`` that runs
  on the platform, beside cuDNN's causal attention on the same rows without segment ids (the speed of
  light; it ignores document boundaries). Also the compiled memory of each (XLA memory analysis).
- ``train_step``: the real train step (AdamW) of a ~125M LM (d_model 768, 12 layers, vocab 50304,
  bf16) with one mixer in every layer, T = 4096, 8 rows, ``kernel_impl=auto``: tokens/s, MFU (3 x the
  mixer registry's forward FLOPs per token over the device's peak, ``seqmodels.training.flops``), the
  compiled step's memory and the device's peak bytes, and tokens/s as a ratio to Transformer++.
- ``atlas_memory``: the Atlas memory op (``pallas_kernels/atlas_memory``, ``impl=auto``) at
  ``configs/atlas.yaml``'s settings on a one-GPU LM shape (B8 T4096, d_model 512 = 8 heads of 64; window
  8, chunk 16, 5 Newton-Schulz steps, 2-layer MLP memory, Newton-Schulz in bf16), with
  ``ns_granularity`` token (the paper's rule; ``impl=auto`` and ``impl=pallas``, the fused Triton sweep of
  ``pallas_kernels/atlas_memory/triton.py``) and chunk, forward and forward+backward, beside Gated
  DeltaNet's op (``gated_delta_rule``) at the same rows and heads: ms and each time over Gated
  DeltaNet's (``kernel_cases._atlas_memory_cases``). A failure (e.g. out of memory) is recorded as the result.
- ``context_parallel``: the train step of Transformer++ and Gated DeltaNet on every device of the node
  with each row split over ``mesh.context = N`` against the same rows split over ``mesh.data = N``
  (``benchmarks/context_parallel.py``): tokens/s and memory per device, and their ratios. On one device
  it is skipped, with that reason; ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` runs it on CPU.

Absolute times mean something only on a GPU; ``--small`` checks the plumbing on CPU (Pallas in
interpret mode), and its ratios are CPU ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import context_parallel
from benchmarks import kernels as kernel_bench
from benchmarks import train_step as train_bench
from benchmarks.kernel_cases import CASE_BUILDERS, Case, newton_schulz_flops

SECTIONS = ("kernels", "packed_attention", "train_step", "atlas_memory", "context_parallel")
ANCHORS = Path(__file__).resolve().parent / "anchors"
TRAIN_MIXERS = ("attention", "swa", "mamba2", "deltanet", "gated_deltanet", "longhorn", "muonssm_mamba2",
                "muonssm_gated_deltanet", "muonssm_longhorn", "atlas")
# anchor "test" name -> (op, shape key) it is the reference line of
ANCHOR_OPS = {"fla_simple_gla_fwd": "chunk_gla", "fla_gated_delta_fwd": "gated_delta_rule",
              "ssd_chunked_xla_fwd": "chunk_gla", "ssd_chunked_xla_fwdbwd": "chunk_gla",
              "diag_scan_assoc": "linear_scan", "diag_scan_pallas_seq": "linear_scan",
              "newton_schulz_xla": "newton_schulz", "newton_schulz_torch": "newton_schulz",
              "newton_schulz_torch_compile": "newton_schulz"}


def load_anchors(directory: Path) -> list[dict]:
    """Every anchor record (JSON lines) that names an op of this suite; [] when the directory is absent."""
    records = []
    for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("test") in ANCHOR_OPS and "error" not in record:
                records.append({**record, "source": path.name})
    return records


def _shape_key(case: Case) -> list[int]:
    shape = case.shape
    if case.op == "newton_schulz":
        return list(shape["matrices"])
    if case.op == "linear_scan":
        return [shape["B"], shape["T"], shape["D"]] if "D" in shape else []
    return [shape.get("B"), shape.get("T"), shape.get("H"), shape.get("K")]


def reference_lines(case: Case, anchors: list[dict]) -> list[dict]:
    """The anchor records of the case's op at its shape (per-head decay only for chunk_gla)."""
    if case.op == "chunk_gla" and case.shape.get("decay") != "per head":
        return []
    key = _shape_key(case)
    return [a for a in anchors if ANCHOR_OPS[a["test"]] == case.op and a.get("shape") == key]


def _kernel_cases(small: bool) -> list[Case]:
    cases = [case for op, builder in CASE_BUILDERS.items() if op != "atlas_memory" for case in builder(small)]
    if not small:  # the anchors' second large Newton-Schulz shape
        from pallas_kernels import newton_schulz
        shape = (4096, 11008)
        cases.append(Case(op="newton_schulz", shape=dict(matrices=list(shape)), dtype="bfloat16",
                          make_inputs=lambda: (jax.random.normal(jax.random.PRNGKey(9), shape).astype(jnp.bfloat16),),
                          functions={impl: (lambda x, impl=impl: newton_schulz(x, steps=5, impl=impl))
                                     for impl in ("xla", "pallas")},
                          tokens=None, flops=newton_schulz_flops(shape)))
    return cases


def run_kernels(small: bool, repeats: int, anchors: list[dict]) -> list[dict]:
    records = []
    for case in _kernel_cases(small):
        references = reference_lines(case, anchors)
        for record in kernel_bench.run_case(case, repeats):
            records.append({**record, "reference": references})
            print(json.dumps({k: v for k, v in record.items() if k != "reference"}), flush=True)
    return records


def _packed_rows(batch: int, seq_len: int, documents: int):
    """``(segment_ids, positions)`` of rows holding ``documents`` equal documents each."""
    length = seq_len // documents
    index = np.arange(seq_len)
    segments = np.minimum(index // length, documents - 1) + 1
    positions = index - (segments - 1) * length
    return (jnp.broadcast_to(jnp.asarray(segments, jnp.int32), (batch, seq_len)),
            jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (batch, seq_len)))


def packed_attention_case(small: bool) -> Case:
    from seqmodels.layers.attention import attend, attend_rows
    from pallas_kernels._common import target_platform
    batch, seq_len, heads, head_dim = (1, 256, 2, 32) if small else (8, 4096, 16, 128)
    dtype = jnp.float32 if small else jnp.bfloat16
    segments, positions = _packed_rows(batch, seq_len, documents=4)

    def make_inputs():
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        return tuple(jax.random.normal(key, (batch, seq_len, heads, head_dim)).astype(dtype) for key in keys)

    def rows_with(implementation):
        return lambda q, k, v: attend_rows(q, k, v, segments, positions, window=None, num_sinks=0, causal=True,
                                           implementation=implementation)

    functions = {"causal, no segment ids (auto: cuDNN on GPU)": lambda q, k, v: attend(q, k, v)}
    functions["xla (explicit [T, T] mask)"] = rows_with("xla")
    functions["auto"] = rows_with("auto")
    if target_platform() == "gpu" or small:  # the Triton flash kernels (interpret mode on CPU)
        functions["flash (Pallas Triton, segment ids)"] = rows_with("flash")
    if target_platform() == "tpu" or small:  # splash compiles for TPU only; interpret mode elsewhere
        functions["splash"] = rows_with("splash")
    flops = 4 * batch * heads * head_dim * seq_len * (seq_len + 1) / 2  # causal: half the scores
    return Case(op="packed_attention", shape=dict(B=batch, T=seq_len, H=heads, D=head_dim, documents=4),
                dtype=jnp.dtype(dtype).name, make_inputs=make_inputs, functions=functions,
                tokens=batch * seq_len, flops=float(flops))


def run_packed_attention(small: bool, repeats: int) -> list[dict]:
    case = packed_attention_case(small)
    args = case.make_inputs()
    records = kernel_bench.run_case(case, repeats)
    for record in records:
        compiled = jax.jit(case.functions[record["impl"]]).lower(*args).compile()
        record["compiled_bytes"] = train_bench._memory(compiled)
        print(json.dumps(record), flush=True)
    return records


def atlas_ratios(records: list[dict]) -> list[dict]:
    """Each record with its forward and forward+backward times over Gated DeltaNet's (the first record)."""
    baseline = records[0] if records and records[0]["op"] == "gated_delta_rule" else {}
    out = []
    for record in records:
        record = dict(record)
        for key in ("fwd_ms", "fwdbwd_ms"):
            if record.get(key) and baseline.get(key):
                record[f"{key.removesuffix('_ms')}_time_vs_gated_deltanet"] = record[key] / baseline[key]
        out.append(record)
    return out


def _atlas_case_records(case: Case, repeats: int) -> list[dict]:
    """``run_case``'s records; if forward+backward fails, the forward alone with the error beside it."""
    try:
        return kernel_bench.run_case(case, repeats)
    except Exception as error:  # an OOM or a lowering failure is a result too
        message = f"{type(error).__name__}: {str(error)[:500]}"
    try:
        forward = dataclasses.replace(case, forward_only=tuple(case.functions))
        return [{**record, "fwdbwd_error": message} for record in kernel_bench.run_case(forward, repeats)]
    except Exception as error:
        return [dict(op=case.op, impl=name, shape=case.shape, dtype=case.dtype,
                     error=f"{type(error).__name__}: {str(error)[:500]}") for name in case.functions]


def run_atlas_memory(small: bool, repeats: int) -> list[dict]:
    records = []
    for case in CASE_BUILDERS["atlas_memory"](small):
        records += _atlas_case_records(case, repeats)
    records = atlas_ratios(records)
    for record in records:
        print(json.dumps(record), flush=True)
    return records


def run_context_parallel(small: bool) -> list[dict]:
    records = context_parallel.run(small)
    for record in records:
        print(json.dumps(record), flush=True)
    return records


def run_train_steps(small: bool, mixers: tuple[str, ...]) -> list[dict]:
    from seqmodels.training.flops import peak_flops_per_device
    args = train_bench.parse_args(["--small"] if small else ["--seq-lens", "4096", "--tokens-per-step", "32768"])
    peak = peak_flops_per_device(0.0, "float32" if small else "bfloat16")
    rows = []
    for mixer in mixers:
        try:
            row = train_bench.run_case(args, mixer, "auto", int(args.seq_lens.split(",")[0]))
            row["mfu"] = row["model_tflops_per_second"] * 1e12 / peak
        except Exception as error:  # an OOM or a lowering failure is a result too
            row = {"mixer": mixer, "error": f"{type(error).__name__}: {str(error)[:500]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    baseline = next((r["tokens_per_second"] for r in rows if r["mixer"] == "attention" and "error" not in r), None)
    for row in rows:
        if "error" not in row and baseline:
            row["tokens_per_second_vs_transformer"] = row["tokens_per_second"] / baseline
    return rows


def _ms(value) -> str:
    return "" if value is None else f"{value:.3f}"


def markdown(report: dict) -> str:
    """The report's tables, one per section that ran."""
    lines = [f"# GPU suite on {report['device']} ({report['backend']})", "", f"`{report['command']}`"]
    for section, table in (("kernels", _kernels_markdown), ("packed_attention", _attention_markdown),
                           ("train_step", _train_markdown), ("atlas_memory", _atlas_markdown),
                           ("context_parallel", _context_markdown)):
        if report.get(section):
            lines += table(report[section])
    return "\n".join(lines) + "\n"


def _kernels_markdown(records: list[dict]) -> list[str]:
    lines = ["", "## Kernels", "", "| op | shape | impl | fwd ms | fwd+bwd ms | fwd vs first | reference lines |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        ratio = next((v for k, v in r.items() if k.startswith("fwd_time_vs_")), None)
        refs = "; ".join(f"{a['test']} {1e3 * a['s']:.3f} ms" for a in r["reference"])
        lines.append(f"| {r['op']} | {json.dumps(r['shape'])} | {r['impl']} | {_ms(r['fwd_ms'])} | "
                     f"{_ms(r.get('fwdbwd_ms'))} | {ratio:.2f} | {refs} |")
    return lines


def _attention_markdown(records: list[dict]) -> list[str]:
    lines = ["", "## Attention over packed rows", "", "| impl | fwd ms | fwd+bwd ms | compiled bytes |",
             "|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['impl']} | {_ms(r['fwd_ms'])} | {_ms(r.get('fwdbwd_ms'))} | {r['compiled_bytes']} |")
    return lines


def _train_markdown(records: list[dict]) -> list[str]:
    lines = ["", "## Train step", "", "| mixer | params | tokens/s | vs Transformer++ | MFU | compiled bytes | "
             "device peak bytes |", "|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['mixer']} | failed: {r['error'][:100]} | | | | | |")
            continue
        lines.append(f"| {r['mixer']} | {r['params'] / 1e6:.0f}M | {r['tokens_per_second']:.0f} | "
                     f"{r.get('tokens_per_second_vs_transformer', float('nan')):.2f} | {r['mfu']:.3f} | "
                     f"{r['compiled_bytes']} | {r['device_peak_bytes']} |")
    return lines


def _ratio(value) -> str:
    return "" if value is None else f"{value:.2f}"


def _atlas_markdown(records: list[dict]) -> list[str]:
    lines = ["", "## Atlas memory op against Gated DeltaNet", "",
             "| op | ns_granularity | shape | impl | fwd ms | fwd+bwd ms | fwd vs GDN | fwd+bwd vs GDN | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        error = r.get("error") or r.get("fwdbwd_error") or ""
        lines.append(f"| {r['op']} | {r['shape'].get('ns_granularity', '')} | {json.dumps(r['shape'])} | {r['impl']} | "
                     f"{_ms(r.get('fwd_ms'))} | {_ms(r.get('fwdbwd_ms'))} | {_ratio(r.get('fwd_time_vs_gated_deltanet'))} | "
                     f"{_ratio(r.get('fwdbwd_time_vs_gated_deltanet'))} | {error[:100]} |")
    return lines


def _context_markdown(records: list[dict]) -> list[str]:
    lines = ["", "## Context parallelism on one node", "",
             "| mixer | layout | T | rows | tokens/s | vs data layout | compiled bytes / device | vs data layout | "
             "device peak bytes | loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "skipped" in r or "error" in r:
            lines.append(f"| {r['mixer']} | {r.get('layout', '')} | {'skipped' if 'skipped' in r else 'failed'}: "
                         f"{(r.get('skipped') or r.get('error'))[:100]} | | | | | | | |")
            continue
        lines.append(f"| {r['mixer']} | {r['layout']} | {r['seq_len']} | {r['batch_size']} | "
                     f"{r['tokens_per_second']:.0f} | {_ratio(r.get('tokens_per_second_vs_data'))} | "
                     f"{r['compiled_bytes_per_device']} | {_ratio(r.get('compiled_bytes_vs_data'))} | "
                     f"{r['device_peak_bytes']} | {r['loss']:.5f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for gpu_suite.json and gpu_suite.md")
    parser.add_argument("--small", action="store_true", help="tiny shapes: a CPU smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per function (default 10, --small 1)")
    parser.add_argument("--mixers", default=",".join(TRAIN_MIXERS), help="train-step mixers")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated sections to run")
    parser.add_argument("--anchors", default=str(ANCHORS), help="directory of the anchor JSON lines")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    mixers = tuple(filter(None, args.mixers.split(",")))
    sections = tuple(filter(None, args.sections.split(",")))
    if set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(set(sections) - set(SECTIONS))}; known: {SECTIONS}")
    import seqmodels.mixers  # noqa: F401  (registers every mixer)
    from seqmodels.mixers.registry import MIXERS
    unknown = [m for m in mixers if m not in MIXERS]
    if unknown:
        parser.error(f"unknown mixers {unknown}; registered: {sorted(MIXERS)}")
    repeats = args.repeats or (1 if args.small else 10)
    report = {"command": " ".join(["python benchmarks/gpu_suite.py", *(sys.argv[1:] if argv is None else argv)]),
              "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
              "platform": platform.platform(), "small": args.small}
    runs = {"kernels": lambda: run_kernels(args.small, repeats, load_anchors(Path(args.anchors))),
            "packed_attention": lambda: run_packed_attention(args.small, repeats),
            "train_step": lambda: run_train_steps(args.small, mixers),
            "atlas_memory": lambda: run_atlas_memory(args.small, repeats),
            "context_parallel": lambda: run_context_parallel(args.small)}
    for section in SECTIONS:
        report[section] = runs[section]() if section in sections else []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_suite.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu_suite.md").write_text(markdown(report))
    print(f"wrote {out / 'gpu_suite.json'} and {out / 'gpu_suite.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
