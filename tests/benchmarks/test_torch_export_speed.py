"""Smoke test of ``benchmarks/torch_export_speed.py`` (``--small``: T = 80, Gated DeltaNet and Mamba2): it writes
a JSON row per mixer with both forms' rates and their ratio, and the markdown table beside it. No timing is
asserted (a shared CPU)."""

import json

from benchmarks import torch_export_speed


def test_torch_export_speed_writes_both_forms_and_their_ratio(tmp_path):
    out = tmp_path / "speed.json"
    assert torch_export_speed.main(["--small", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [row["mixer"] for row in result["rows"]] == ["gated_deltanet", "mamba2"]
    for row in result["rows"]:
        assert row["length"] == 80 and row["chunked_layers"] == 2  # both layers switched between the forms
        for kind in ("forward", "forward_backward"):
            assert row[f"recurrent_{kind}"] > 0 and row[f"chunked_{kind}"] > 0
            assert abs(row[f"speedup_{kind}"] - row[f"chunked_{kind}"] / row[f"recurrent_{kind}"]) < 1e-9
    table = out.with_suffix(".md").read_text()
    assert "| Gated DeltaNet | 80 |" in table and "| Mamba2 | 80 |" in table
