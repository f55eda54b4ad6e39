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
