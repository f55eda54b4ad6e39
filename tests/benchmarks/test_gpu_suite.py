"""benchmarks/gpu_suite.py --small runs every section on CPU and writes its JSON and markdown."""

import json

import pytest

from benchmarks import gpu_suite


# Three train-step mixers (attention, a chunk_gla and a delta-rule mixer) keep the CI run to minutes; the
# full suite runs every mixer of TRAIN_MIXERS.
MIXERS = ("attention", "mamba2", "gated_deltanet")


@pytest.mark.slow
def test_small_suite_runs_every_section_and_the_train_step_of_each_mixer(tmp_path):
    assert gpu_suite.main(["--small", "--out", str(tmp_path), "--mixers", ",".join(MIXERS)]) == 0
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    ops = {record["op"] for record in report["kernels"]}
    assert ops == {"linear_scan", "chunk_gla", "gated_delta_rule", "newton_schulz"}
    assert all(record["fwd_ms"] > 0 for record in report["kernels"])
    attention = {record["impl"]: record for record in report["packed_attention"]}
    assert {"xla (explicit [T, T] mask)", "auto", "splash"} <= set(attention)
    assert all(record["compiled_bytes"] > 0 for record in attention.values())
    steps = {row["mixer"]: row for row in report["train_step"]}
    assert set(steps) == set(MIXERS)
    assert all("error" not in row for row in steps.values()), [row.get("error") for row in steps.values()]
    assert steps["attention"]["tokens_per_second_vs_transformer"] == 1.0
    assert all(row["tokens_per_second"] > 0 and 0 < row["mfu"] for row in steps.values())
    assert "## Train step" in (tmp_path / "gpu_suite.md").read_text()


def test_reference_lines_match_the_anchor_shapes_of_the_full_suite():
    anchors = gpu_suite.load_anchors(gpu_suite.ANCHORS)
    cases = {(case.op, json.dumps(case.shape)): case for case in gpu_suite._kernel_cases(small=False)}
    lines = {key: [a["test"] for a in gpu_suite.reference_lines(case, anchors)] for key, case in cases.items()}
    gla = next(v for (op, shape), v in lines.items() if op == "chunk_gla" and "per head" in shape)
    assert "fla_simple_gla_fwd" in gla
    assert any("fla_gated_delta_fwd" in v for (op, _), v in lines.items() if op == "gated_delta_rule")
    ns = [v for (op, _), v in lines.items() if op == "newton_schulz"]
    assert len(ns) == 5 and all("newton_schulz_torch" in v for v in ns)


def test_an_unknown_mixer_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit):
        gpu_suite.main(["--small", "--out", str(tmp_path), "--mixers", "attention,transformer_xl"])
