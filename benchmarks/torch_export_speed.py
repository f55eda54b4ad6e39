"""PyTorch speed of the exported recurrent mixers: the recurrent form against the chunk-parallel one, one run.

    python benchmarks/torch_export_speed.py                      # T = 1024, 4096; writes results/torch_export_speed/
    python benchmarks/torch_export_speed.py --small --out scratch/speed.json     # seconds, for a smoke test

For each of Gated DeltaNet, Mamba2, MuonSSM (on Gated DeltaNet), LongHorn, MuonSSM (on LongHorn) and Atlas: the
PyTorch twin (``seqmodels.hf.torch``, ``SeqmodelsForCausalLM``) of two layers of that mixer at its config's settings
(``configs/<name>.yaml``), d_model 64, a 256-token vocabulary, batch 1, random weights, on one CPU thread
(``torch.set_num_threads(1)``). It times the forward (no gradients) and forward + backward of the LM loss
at each length, in both ``scan_form`` s (``chunked.set_scan_form``: ``recurrent``, one state update per
token; ``chunked``, chunks of 64; Atlas's chunk form runs over its own memory chunks,
``model.atlas.chunk_size``, which are part of its rule), and reports tokens/s (the median of ``--repeats``
calls after a short warm-up) and chunked / recurrent. A mixer without a chunk form would run its recurrent
form under either setting, the same computation: it is timed once and its chunked columns are empty. (The reference-layout
Mamba2 config exports as transformers' own ``Mamba2ForCausalLM``; what is timed here is the seqmodels twin that its other layouts export as.)
Writes JSON (``--out``) and a markdown table beside it (same name, ``.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "torch_export_speed"
MIXERS = {"gated_deltanet": "Gated DeltaNet", "mamba2": "Mamba2", "muonssm_gated_deltanet": "MuonSSM (GDN)",
          "longhorn": "LongHorn", "muonssm_longhorn": "MuonSSM (LongHorn)", "atlas": "Atlas"}
FORMS = ("recurrent", "chunked")
VOCAB, WIDTH, LAYERS, CHUNK = 256, 64, 2, 64


def build_model(mixer: str, seed: int = 0):
    """The PyTorch twin of ``LAYERS`` layers of ``mixer`` at ``configs/<mixer>.yaml``'s settings, random weights."""
    from seqmodels.config_io import model_config_from_dict, read_yaml
    from seqmodels.hf.remote_code import hf_config_from_model
    from seqmodels.hf.torch.configuration_seqmodels import SeqmodelsConfig
    from seqmodels.hf.torch.lm import SeqmodelsForCausalLM
    path = ROOT / "configs" / f"{mixer}.yaml"
    if not path.exists():
        raise SystemExit(f"no config {path} for mixer {mixer!r}; choose from {', '.join(MIXERS)}")
    config = model_config_from_dict(read_yaml(path).get("model", {}))
    config = dataclasses.replace(config, vocab_size=VOCAB, d_model=WIDTH, mixers=(mixer,) * LAYERS, scan_layers=False)
    model = SeqmodelsForCausalLM(SeqmodelsConfig(model=hf_config_from_model(config, torch_dtype="float32")["model"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model


def seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model, length: int, repeats: int) -> dict:
    """Tokens/s of the forward and of forward + backward on one row of ``length`` tokens."""
    ids = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))

    def forward():
        with torch.no_grad():
            model(ids)

    def forward_backward():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
    warm = ids[:, :2 * CHUNK + 3]
    model(warm, labels=warm).loss.backward()
    return {"forward": length / seconds(forward, repeats), "forward_backward": length / seconds(forward_backward, repeats)}


def run(mixers, lengths, repeats: int) -> list[dict]:
    from seqmodels.hf.torch.chunked import set_scan_form
    torch.set_num_threads(1)
    rows = []
    for mixer in mixers:
        model = build_model(mixer)
        for length in lengths:
            row = {"mixer": mixer, "length": length}
            for form in FORMS:
                row["chunked_layers"] = set_scan_form(model, form, chunk_size=CHUNK)
                if form == "chunked" and not row["chunked_layers"]:
                    row.update(chunked_forward=None, chunked_forward_backward=None)
                    continue
                for kind, rate in measure(model, length, repeats).items():
                    row[f"{form}_{kind}"] = rate
                print(f"{mixer} T={length} {form}: " + ", ".join(
                    f"{k} {row[f'{form}_{k}']:.0f} tok/s" for k in ("forward", "forward_backward")), flush=True)
            for kind in ("forward", "forward_backward"):
                chunked = row[f"chunked_{kind}"]
                row[f"speedup_{kind}"] = None if chunked is None else chunked / row[f"recurrent_{kind}"]
            rows.append(row)
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"PyTorch twins, {LAYERS} layers, d_model {WIDTH}, batch 1, one CPU thread, chunks of {CHUNK}; "
             f"tokens/s (median of {meta['repeats']}); load average before / after: {meta['load_before']} / "
             f"{meta['load_after']}.", "",
             "| mixer | T | recurrent fwd | chunked fwd | fwd speedup | recurrent fwd+bwd | chunked fwd+bwd | "
             "fwd+bwd speedup |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    def cell(value, unit=""):
        return "-" if value is None else f"{value:.1f}{unit}" if unit else f"{value:.0f}"
    for row in rows:
        name = MIXERS.get(row["mixer"], row["mixer"]) + ("" if row["chunked_layers"] else " (no chunk form)")
        lines.append(f"| {name} | {row['length']} | {cell(row['recurrent_forward'])} | {cell(row['chunked_forward'])} | "
                     f"{cell(row['speedup_forward'], 'x')} | {cell(row['recurrent_forward_backward'])} | "
                     f"{cell(row['chunked_forward_backward'])} | {cell(row['speedup_forward_backward'], 'x')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixers", nargs="+", default=list(MIXERS), choices=list(MIXERS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="T = 80, one repeat, Gated DeltaNet and Mamba2 only")
    parser.add_argument("--out", type=Path, default=RESULTS / "torch_export_speed.json")
    args = parser.parse_args(argv)
    if args.small:
        args.mixers, args.lengths, args.repeats = ["gated_deltanet", "mamba2"], [80], 1
    if args.repeats < 1 or any(length < 1 for length in args.lengths):
        parser.error("--repeats and every --lengths must be positive")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = run(args.mixers, args.lengths, args.repeats)
    meta = {"command": "python " + shlex.join(sys.argv), "torch": torch.__version__, "threads": 1,
            "machine": platform.processor() or platform.machine(), "repeats": args.repeats,
            "load_before": load_before, "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
