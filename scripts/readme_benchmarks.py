"""README tables of the benchmarks: TPU ahead-of-time compiles, export parity, the H200 anchors, the
compilation cache."""

from __future__ import annotations

import json

from readme_format import compact_table, load_json, read_text

from benchmarks.tpu_aot import step_tflops


TPU_AOT = "benchmarks/results/tpu_aot/tpu_aot.json"


def tpu_aot() -> str:
    """benchmarks/results/tpu_aot/tpu_aot.json: every row that compiled (the failures are in the text), its
    parameters, per-chip temporaries and peak memory, the FLOPs registry's training FLOPs per chip per step
    (XLA's own count, which sees a loop body once, for rows compiled before the registry's was recorded),
    Mosaic calls and compile seconds."""
    gib = 2.0 ** 30
    rows = []
    for row in load_json(TPU_AOT)["rows"]:
        if "error" in row:
            continue
        rows.append([row["arch"], row["size"], f"{row['topology']} ({row['device_kind']} x {row['num_devices']})",
                     f"{row['num_params'] / 1e6:.0f}M", f"{row['temp_bytes'] / gib:.2f}", f"{row['peak_bytes'] / gib:.2f}",
                     step_tflops(row), str(row["mosaic_kernels"]), f"{row['compile_seconds']:.0f}"])
    return compact_table(["arch", "size", "topology", "params", "temps GiB", "peak GiB", "TFLOPs / chip / step",
                     "Mosaic calls", "compile s"], rows)


COMPILATION_CACHE = "benchmarks/results/compilation_cache.json"


def compilation_cache() -> str:
    """benchmarks/results/compilation_cache.json: per case, the medians over its cold-warm pairs of the compile
    seconds the run logged and of the whole 1-step process, the warm / cold compile ratio, and whether every
    warm first loss was bitwise the cold one's."""
    results = load_json(COMPILATION_CACHE)
    rows = [[name, f"{case['cold_compile_seconds']:.2f}", f"{case['warm_compile_seconds']:.2f}",
             f"{case['compile_ratio']:.3f}", f"{case['cold_process_seconds']:.1f}", f"{case['warm_process_seconds']:.1f}",
             "yes" if case["losses_bitwise_equal"] else "no"]
            for name, case in results["cases"].items()]
    return compact_table([f"case (median of {results['repeats']})", "compile s, cold", "compile s, warm",
                          "warm / cold", "1-step process s, cold", "warm", "same loss bitwise"], rows)


PARITY = "results/export_parity/parity.json"


def export_parity() -> str:
    """results/export_parity/parity.json (``export_parity.py --json``): per causal model its mixers (an AHN
    model's compressor, window and how far it moves the logits), the exported class, the max abs logit
    difference of whole rows and of cache decoding, the logit scale and whether the greedy tokens agree."""
    rows = []
    for record in load_json(PARITY)["causal"]:
        mixers = ", ".join(record["mixers"])
        if record["kind"] == "ahn":
            ahn = record["ahn"]
            mixers += (f" + {ahn['compressor']} compressor (window {ahn['window']}, {ahn['sinks']} sinks; "
                       f"moves the logits by {record['compressor_effect']:.2f})")
        rows.append([record["name"], mixers, record["architecture"], f"{record['max_abs']:.2e}",
                     f"{record['cached_max_abs']:.2e}", f"{record['logit_scale']:.2f}", str(record["greedy_equal"])])
    return compact_table(["config", "mixers", "exported as", "max abs logit diff", "decoded from the cache", "logit scale",
                     "16 greedy tokens equal"], rows)


def export_parity_looped() -> str:
    """results/export_parity/parity.json: per looped variant its block mixer, the exported class, the max abs
    difference of the vocabulary logits and whether accept / reject agree on the 64 strings."""
    rows = [[record["name"], record["block_mixer"], record["architecture"], f"{record['max_abs']:.2e}",
             "all equal" if record["decisions_equal"] else "not all equal"] for record in load_json(PARITY)["looped"]]
    return compact_table(["looped variant", "block mixer", "exported as", "max abs logit diff",
                     "accept / reject on 64 strings"], rows)


ANCHORS = "benchmarks/anchors"
ANCHOR_FILES = tuple(f"{ANCHORS}/h200-probe-{name}.jsonl" for name in ("jax", "pallas-fla", "torch"))


def _probe(test: str, shape=None) -> dict:
    """The one record of ``test`` (and ``shape``) in the anchors' JSON lines."""
    records = [json.loads(line) for path in ANCHOR_FILES for line in read_text(path).splitlines() if line]
    (record,) = [r for r in records if r["test"] == test and (shape is None or r.get("shape") == shape)]
    return record


def _ms(record: dict) -> str:
    return f"{record['s'] * 1e3:.2f} ms"


def _tflops(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def anchors() -> str:
    """benchmarks/anchors/h200-probe-*.jsonl: each probe's median seconds and the rate it records (GB/s,
    TFLOP/s or M tokens/s)."""
    copy = _probe("copy_bw")
    scan = [4, 8192, 4096]
    chunk = [8, 4096, 16, 128]
    assoc = _probe("diag_scan_assoc", scan)
    rows = [["copy (x + 1, f32, XLA)", "1 GiB in, 1 GiB out", _ms(copy), f"{copy['GBps'] / 1e3:.2f} TB/s"]]
    matmul = _probe("matmul_bf16")
    rows.append(["bf16 matmul (XLA)", f"{matmul['n']}^3", _ms(matmul), f"{matmul['TFLOPs']:.0f} TFLOP/s"])
    triton = _probe("pallas_triton_matmul")
    rows.append(["bf16 matmul (plain Pallas Triton kernel, 128x128x64 tiles)", f"{triton['n']}^3", _ms(triton),
                 f"{triton['TFLOPs']:.0f} TFLOP/s"])
    cudnn, pallas_attention = _probe("cudnn_attention"), _probe("pallas_ops_gpu_attention")
    rows.append(["causal attention, cuDNN via jax.nn.dot_product_attention", "B8 T4096 H16 D128 bf16", _ms(cudnn),
                 f"{cudnn['TFLOPs']:.0f} TFLOP/s"])
    rows.append(["causal attention, deprecated pallas.ops.gpu.attention", "same", _ms(pallas_attention),
                 f"{pallas_attention['TFLOPs']:.0f} TFLOP/s"])
    rows.append(["diagonal scan h=a*h+b, lax.associative_scan", "B4 T8192 D4096 f32", _ms(assoc),
                 f"{assoc['GBps_effective'] / 1e3:.2f} TB/s effective "
                 f"({100 * assoc['GBps_effective'] / copy['GBps']:.0f}% of copy)"])
    rows.append(["same, fwd+bwd", "same", _ms(_probe("diag_scan_assoc_fwdbwd", scan)), ""])
    lax_scan = _probe("diag_scan_lax_scan", scan)
    rows.append(["same, lax.scan over T", "same", f"{lax_scan['s'] * 1e3:.0f} ms", f"{lax_scan['GBps_effective']:.0f} GB/s"])
    sequential = _probe("diag_scan_pallas_seq", scan)
    rows.append([f"same, naive Pallas Triton (sequential over T, {sequential['bd']} channels/program)", "same",
                 _ms(sequential), f"{sequential['GBps_effective'] / 1e3:.2f} TB/s"])
    for label, test, prefix in (
            ("scalar-decay chunked linear attention (SSD / simple GLA), pure JAX, chunk 64", "ssd_chunked_xla_fwd", "fwd "),
            ("same, fwd+bwd", "ssd_chunked_xla_fwdbwd", ""),
            ("same op, flash-linear-attention 0.6 (Triton, PyTorch)", "fla_simple_gla_fwd", "fwd "),
            ("gated delta rule, flash-linear-attention 0.6", "fla_gated_delta_fwd", "fwd ")):
        record = _probe(test, chunk)
        rows.append([label, "B8 T4096 H16 K=V=128 bf16" if test == "ssd_chunked_xla_fwd" else "same",
                     prefix + _ms(record), f"{record['Mtok_per_s']:.1f} M tok/s"])
    for label, shape in (("Newton–Schulz 5 steps bf16 (XLA)", [4096, 4096]), ("same", [4096, 11008]),
                         ("same, batched", [1024, 128, 128]), ("same, batched", [256, 64, 64]),
                         ("same, batched", [64, 1024, 1024])):
        record = _probe("newton_schulz_xla", shape)
        size = "x".join(map(str, shape)) if len(shape) == 2 else f"{shape[0]} x {shape[1]}x{shape[2]}"
        rows.append([label, size, _ms(record), f"{_tflops(record['TFLOPs'])} TFLOP/s"])
    eager, compiled = _probe("newton_schulz_torch", [1024, 128, 128]), _probe("newton_schulz_torch_compile", [1024, 128, 128])
    rows.append(["Newton–Schulz, PyTorch eager / torch.compile", "1024 x 128x128",
                 f"{eager['s'] * 1e3:.2f} / {compiled['s'] * 1e3:.2f} ms",
                 f"{_tflops(eager['TFLOPs'])} / {_tflops(compiled['TFLOPs'])} TFLOP/s"])
    return compact_table(["what", "shape", "time", "rate"], rows)
