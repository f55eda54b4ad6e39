"""benchmarks/gpu_suite.py --small runs every section on CPU and writes its JSON and markdown."""

import json

import pytest

from benchmarks import gpu_suite


# Three train-step mixers (attention, a chunk_gla and a delta-rule mixer) keep the CI run to minutes; the
# full suite runs every mixer of TRAIN_MIXERS.
MIXERS = ("attention", "mamba2", "gated_deltanet")


@pytest.mark.slow
def test_small_suite_runs_the_kernel_attention_and_train_step_sections_for_each_mixer(tmp_path):
    # the Atlas and context-parallel sections have their own tests below
    assert gpu_suite.main(["--small", "--out", str(tmp_path), "--mixers", ",".join(MIXERS),
                           "--sections", "kernels,packed_attention,train_step"]) == 0
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


def test_atlas_ratios_are_each_time_over_the_gated_deltanet_time_of_the_same_run():
    common = {"impl": "auto", "shape": {}}
    records = [{**common, "op": "gated_delta_rule", "fwd_ms": 2.0, "fwdbwd_ms": 5.0},
               {**common, "op": "atlas_memory", "fwd_ms": 6.0, "fwdbwd_ms": 40.0},
               {**common, "op": "atlas_memory", "fwd_ms": 3.0, "fwdbwd_error": "RESOURCE_EXHAUSTED: out of memory"}]
    gdn, token, chunk = gpu_suite.atlas_ratios(records)
    assert (gdn["fwd_time_vs_gated_deltanet"], gdn["fwdbwd_time_vs_gated_deltanet"]) == (1.0, 1.0)
    assert (token["fwd_time_vs_gated_deltanet"], token["fwdbwd_time_vs_gated_deltanet"]) == (3.0, 8.0)
    assert chunk["fwd_time_vs_gated_deltanet"] == 1.5 and "fwdbwd_time_vs_gated_deltanet" not in chunk
    text = gpu_suite.markdown({"device": "cpu", "backend": "cpu", "command": "c", "atlas_memory": [gdn, token, chunk]})
    rows = [line for line in text.splitlines() if line.startswith("| atlas_memory |")]
    assert rows[0].endswith("| 3.00 | 8.00 |  |")
    assert "| 1.50 |  | RESOURCE_EXHAUSTED: out of memory |" in rows[1]  # the error is the result of its row


def test_the_gpu_atlas_section_times_the_paper_rule_also_as_the_fused_triton_sweep():
    """On the GPU shape the token case runs under auto and pallas (the fused Triton kernel, which fits on chip there:
    F = E = 128, V = 64), and the chunk case under auto; the small (CPU) suite leaves the interpreter out."""
    from benchmarks import kernel_cases
    from pallas_kernels.atlas_memory import MemoryLayout, triton
    gdn, token, chunk = kernel_cases._atlas_memory_cases(small=False)
    assert (tuple(token.functions), tuple(chunk.functions)) == (("auto", "pallas"), ("auto",))
    shape = token.shape
    assert triton.fits(MemoryLayout(shape["F"], shape["V"], shape["hidden"]))
    assert tuple(kernel_cases._atlas_memory_cases(small=True)[1].functions) == ("auto",)


@pytest.mark.slow
def test_small_atlas_section_times_token_and_chunk_against_gated_deltanet_and_writes_their_rows(tmp_path):
    assert gpu_suite.main(["--small", "--out", str(tmp_path), "--sections", "atlas_memory"]) == 0
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    gdn, token, chunk = report["atlas_memory"]
    assert (gdn["op"], token["op"], chunk["op"]) == ("gated_delta_rule", "atlas_memory", "atlas_memory")
    assert (token["shape"]["ns_granularity"], chunk["shape"]["ns_granularity"]) == ("token", "chunk")
    # the op at configs/atlas.yaml's settings: window 8, chunk 16, 5 steps; features K + 8^2, MLP hidden 2K
    assert (token["shape"]["window"], token["shape"]["chunk"], token["shape"]["ns_steps"]) == (8, 16, 5)
    assert (token["shape"]["F"], token["shape"]["hidden"]) == (32 + 64, 64)
    assert gdn["shape"]["B"] == token["shape"]["B"] and gdn["shape"]["T"] == token["shape"]["T"]
    for record in (token, chunk):
        assert "error" not in record and "fwdbwd_error" not in record, record
        assert record["fwd_ms"] > 0 and record["fwdbwd_ms"] > 0
        assert record["fwd_time_vs_gated_deltanet"] == pytest.approx(record["fwd_ms"] / gdn["fwd_ms"], rel=1e-12)
        assert record["fwdbwd_time_vs_gated_deltanet"] == pytest.approx(record["fwdbwd_ms"] / gdn["fwdbwd_ms"],
                                                                        rel=1e-12)
    text = (tmp_path / "gpu_suite.md").read_text()
    assert "## Atlas memory op against Gated DeltaNet" in text and "## Train step" not in text  # only what ran
    rows = [line for line in text.splitlines() if line.startswith("| atlas_memory |")]
    assert [row.split(" | ")[1] for row in rows] == ["token", "chunk"]
    assert rows[0].split(" | ")[6] == f"{token['fwd_time_vs_gated_deltanet']:.2f}"


@pytest.mark.slow
def test_small_context_row_splits_rows_over_every_simulated_device_and_matches_the_data_layout(tmp_path):
    import jax
    devices = jax.device_count()  # 8 simulated CPU devices (tests/conftest.py)
    assert devices >= 2
    assert gpu_suite.main(["--small", "--out", str(tmp_path), "--sections", "context_parallel"]) == 0
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    records = {(r["mixer"], r["layout"]): r for r in report["context_parallel"]}
    assert set(records) == {(m, layout) for m in ("attention", "gated_deltanet")
                            for layout in (f"data={devices}", f"context={devices}")}
    for mixer in ("attention", "gated_deltanet"):
        whole, split = records[(mixer, f"data={devices}")], records[(mixer, f"context={devices}")]
        assert "error" not in whole and "error" not in split, (whole.get("error"), split.get("error"))
        assert split["mesh"] == {"data": 1, "context": devices} and whole["mesh"] == {"data": devices, "context": 1}
        assert split["tokens_per_device"] == whole["tokens_per_device"] == split["seq_len"]
        assert split["tokens_per_second_vs_data"] == pytest.approx(
            split["tokens_per_second"] / whole["tokens_per_second"], rel=1e-12)
        assert split["compiled_bytes_vs_data"] == pytest.approx(
            split["compiled_bytes_per_device"] / whole["compiled_bytes_per_device"], rel=1e-12)
        # the same rows and initialisation: the split step computes the unsplit one's loss (float32, the
        # loss and the state chain summed in another order: 2e-5, as tests/seqmodels/training/test_context_training)
        assert split["loss"] == pytest.approx(whole["loss"], abs=2e-5)
    assert "## Context parallelism on one node" in (tmp_path / "gpu_suite.md").read_text()


def test_the_context_row_is_skipped_with_its_reason_on_one_device(monkeypatch):
    from benchmarks import context_parallel
    monkeypatch.setattr(context_parallel.jax, "device_count", lambda: 1)
    records = context_parallel.run(small=True)
    assert [r["mixer"] for r in records] == ["attention", "gated_deltanet"]
    assert all("mesh.context needs >= 2" in r["skipped"] for r in records)
    text = gpu_suite.markdown({"device": "cpu", "backend": "cpu", "command": "c", "context_parallel": records})
    assert text.count("| skipped: 1 device") == 2


def test_an_unknown_section_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit):
        gpu_suite.main(["--small", "--out", str(tmp_path), "--sections", "atlas_memory,ring_attention"])
