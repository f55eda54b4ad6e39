"""The Newton–Schulz benchmark runs its --small cases in-process and writes sane JSON."""

import json

from benchmarks import newton_schulz_bench


def test_small_benchmark_times_both_impls_and_writes_json(tmp_path):
    out = tmp_path / "ns.json"
    newton_schulz_bench.main(["--small", "--out", str(out), "--warmup", "1", "--iters", "2"])
    written = json.loads(out.read_text())
    records = written["results"]
    shapes = {tuple(s) for s in newton_schulz_bench.SMALL_SHAPES}
    expected = {(shape, impl) for shape in shapes for impl in ("xla", "pallas")}
    assert {(tuple(r["shape"]), r["impl"]) for r in records} == expected
    assert all(r["ms"] > 0 and r["tflops"] > 0 for r in records)
    # bf16 outputs of entries <= ~1: the two paths differ by a few bf16 ulps at most.
    assert all(r["max_abs_diff_vs_xla"] < 5e-2 for r in records if r["impl"] == "pallas")
    assert newton_schulz_bench.flops((2, 16, 48)) == 2 * 5 * (4 * 16 * 16 * 48 + 2 * 16**3)
