"""Ahead-of-time compilation of the train step for TPU topologies on this CPU machine.

These compile with libtpu, which lives outside the venv (``scripts/setup.sh`` installs
requirements-tpu.txt into ``.libtpu/``), so each runs ``python -m seqmodels.tools.aot`` in a
subprocess whose PYTHONPATH includes it. Without ``.libtpu/`` they fail, naming the command that
installs it (a skip would pass them without compiling anything). Argument checks that need no
compiler run in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LIBTPU = ROOT / ".libtpu"
TINY = ["model.d_model=128", "model.num_heads=4", "train.batch_size=8", "data.seq_len=256", "model.max_seq_len=8192"]


def run_aot(tmp_path, topology: str, config: str | None, overrides: list[str]) -> dict:
    """The JSON report of one ``python -m seqmodels.tools.aot`` run (fails the test on a non-zero exit)."""
    if not (LIBTPU / "libtpu").is_dir():
        pytest.fail(f"libtpu is not installed in {LIBTPU}: bash scripts/setup.sh installs requirements-tpu.txt there")
    out = tmp_path / f"report_{len(list(tmp_path.iterdir()))}.json"
    command = [sys.executable, "-m", "seqmodels.tools.aot", "--topology", topology, "--json", str(out)]
    command += (["--config", str(ROOT / config)] if config else []) + overrides
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(LIBTPU)]), "TPU_SKIP_MDS_QUERY": "1"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return json.loads(out.read_text())


def test_a_missing_topology_or_config_is_a_usage_error_not_a_trace(tmp_path):
    from seqmodels.tools.aot import main
    assert main(["--topology", "v5e:2x4", "--config", str(tmp_path / "missing.yaml")]) == 2
    with pytest.raises(SystemExit):
        main(["--config", "configs/transformer.yaml"])  # --topology is required


@pytest.mark.slow
def test_mamba2_with_muon_compiles_for_v5e_through_the_mosaic_kernels(tmp_path):
    """``kernel_impl`` and ``optim.muon_impl`` left at auto: on a TPU target the chunk_gla forward and
    backward kernels and the Newton-Schulz kernel are Mosaic calls in the compiled step."""
    report = run_aot(tmp_path, "v5e:2x2", "configs/mamba2.yaml",
                     TINY + ["model.mixers=[mamba2] * 2", "optim.name=muon", "model.compute_dtype=bfloat16"])
    assert report["device_kind"].startswith("TPU v5") and report["num_devices"] == 4
    assert report["mosaic_kernels"] >= 3  # chunk_gla forward + backward, Newton-Schulz
    assert report["temp_bytes"] > 0 and report["flops"] > 0 and report["peak_bytes"] > report["argument_bytes"] / 2


@pytest.mark.slow
def test_gated_deltanet_with_full_remat_compiles_for_tpu(tmp_path):
    """The short convolution under ``model.remat=full`` once crashed the TPU compiler (a padded slice
    of a rematerialised window); it must compile, sharded over fsdp and tensor."""
    report = run_aot(tmp_path, "v5e:2x2", "configs/gated_deltanet.yaml",
                     TINY + ["model.mixers=[gated_deltanet] * 2", "model.remat=full", "mesh.data=1", "mesh.fsdp=2",
                             "mesh.tensor=2", "model.compute_dtype=bfloat16"])
    assert report["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2} and report["temp_bytes"] > 0


@pytest.mark.slow
def test_atlas_deltanet_longhorn_and_muonssm_compile_for_tpu_under_auto(tmp_path):
    """``model.kernel_impl`` and ``optim.muon_impl`` left at auto, one layer each of the mixers no other
    compile here covers (the tests above: Mamba2 and Gated DeltaNet; below: attention and swa; the
    hybrids atlas_mag / atlas_mal are Atlas beside attention): each composed op resolves auto for
    itself, so Atlas's Newton-Schulz is the Mosaic kernel while its scans, which have no Mosaic
    kernel, are XLA (Atlas once passed the resolved ``pallas_tpu`` down to them and failed)."""
    report = run_aot(tmp_path, "v5e:2x2", "configs/atlas.yaml",
                     TINY + ["model.mixers=[atlas, deltanet, longhorn, muonssm_gated_deltanet, muonssm_longhorn]",
                             "optim.name=muon", "model.compute_dtype=bfloat16", "model.atlas.poly_key_dim=4",
                             "model.atlas.memory_expansion=1"])
    assert report["num_devices"] == 4 and report["temp_bytes"] > 0 and report["flops"] > 0
    assert report["mosaic_kernels"] >= 3, report  # Newton-Schulz (Atlas, MuonSSM, Muon), the gated delta rule


@pytest.mark.slow
def test_attention_memory_over_packed_rows_grows_linearly_in_seq_len(tmp_path):
    """One attention layer over packed rows (segment ids), one row per chip: with splash attention
    (``auto`` on TPU) doubling T from 4096 to 8192 at most ~doubles the step's temporaries; the
    explicit-mask XLA path holds [H, T, T] float32 scores at T = 8192 (4 heads: 1 GiB), which the
    splash step's temporaries stay far below."""
    overrides = ["model.d_model=128", "model.num_heads=4", "model.mixers=[attention]", "model.max_seq_len=8192",
                 "train.batch_size=4", "model.compute_dtype=bfloat16"]
    temp = {}
    for seq_len in (4096, 8192):
        report = run_aot(tmp_path, "v5e:2x2", None, overrides + [f"data.seq_len={seq_len}"])
        assert report["mosaic_kernels"] >= 2, report  # splash forward and backward
        temp[seq_len] = report["temp_bytes"]
    xla = run_aot(tmp_path, "v5e:2x2", None, overrides + ["data.seq_len=8192", "model.attention.implementation=xla"])
    scores_bytes = 4 * 8192 * 8192 * 4
    assert temp[8192] / temp[4096] < 2.5, temp
    assert xla["temp_bytes"] >= scores_bytes and temp[8192] < scores_bytes / 8, (temp, xla["temp_bytes"])


@pytest.mark.slow
def test_sliding_window_attention_with_sinks_grows_linearly_in_seq_len(tmp_path):
    """One ``swa`` layer with per-document sinks over packed rows, one row per chip: ``auto`` on TPU
    takes the banded form (plain XLA, no Mosaic call), whose step temporaries at most ~double from
    T = 4096 to 8192 and stay far below the [H, T, T] float32 scores of the explicit-mask path (the
    test above measures that path at 1 GiB and more for this shape), and whose FLOPs double (the
    masked path's attention FLOPs quadruple). ``temp_bytes`` counts HBM: XLA may place the band's
    scores (``[H, T, 2 * 128 + 4]`` float32 here) in VMEM, which is linear in T as well."""
    overrides = ["model.d_model=128", "model.num_heads=4", "model.mixers=[swa]", "model.swa.window=128",
                 "model.swa.num_sinks=4", "model.max_seq_len=8192", "train.batch_size=4",
                 "model.compute_dtype=bfloat16"]
    reports = {seq_len: run_aot(tmp_path, "v5e:2x2", None, overrides + [f"data.seq_len={seq_len}"])
               for seq_len in (4096, 8192)}
    temp = {seq_len: report["temp_bytes"] for seq_len, report in reports.items()}
    scores_bytes = 4 * 8192 * 8192 * 4
    assert all(report["mosaic_kernels"] == 0 for report in reports.values()), reports
    assert temp[8192] / temp[4096] < 2.5 and temp[8192] < scores_bytes / 8, temp
    assert reports[8192]["flops"] / reports[4096]["flops"] < 2.1, reports
