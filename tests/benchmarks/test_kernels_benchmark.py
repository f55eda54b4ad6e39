"""The kernel benchmark's --small path runs and writes its JSON (so the script cannot rot)."""

import json

from benchmarks import kernels


def test_small_run_of_one_case_writes_timings_and_bandwidth(tmp_path):
    out = tmp_path / "results.json"
    kernels.main(["--small", "--ops", "linear_scan", "--impls", "copy,reference", "--repeats", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    by_impl = {record["impl"]: record for record in result["records"]}
    assert set(by_impl) == {"copy (x + 1)", "reference (lax.scan)"}
    scan = by_impl["reference (lax.scan)"]
    assert scan["fwd_ms"] > 0 and scan["fwdbwd_ms"] > 0 and scan["fwd_GBps_effective"] > 0
    assert "fwdbwd_ms" not in by_impl["copy (x + 1)"]
    assert by_impl["copy (x + 1)"]["fwd_time_vs_copy (x + 1)"] == 1.0


def test_small_run_times_gated_delta_rule_and_newton_schulz_side_by_side(tmp_path):
    from benchmarks.kernel_cases import newton_schulz_flops
    out = tmp_path / "results.json"
    kernels.main(["--small", "--ops", "gated_delta_rule,newton_schulz", "--impls", "xla", "--repeats", "1",
                  "--out", str(out)])
    records = json.loads(out.read_text())["records"]
    assert [(r["op"], r["impl"]) for r in records] == [("gated_delta_rule", "xla")] + [("newton_schulz", "xla")] * 2
    assert records[0]["fwd_tokens_per_s"] > 0 and records[0]["fwdbwd_ms"] > 0
    assert all(r["fwd_TFLOPs"] > 0 and "fwd_tokens_per_s" not in r for r in records[1:])
    assert newton_schulz_flops((2, 16, 48)) == 2 * 5 * (4 * 16 * 16 * 48 + 2 * 16**3)
