"""Ahead-of-time compilation of the train step for TPU topologies on this CPU machine.

These compile with libtpu, which lives outside the venv (``scripts/setup.sh`` installs
requirements-tpu.txt into ``.libtpu/``). All the compiles of a pytest worker go to one
``python -m seqmodels.tools.aot --serve`` process whose PYTHONPATH includes it (started on the first
compile): Python, JAX and libtpu start once, not once per case. Without ``.libtpu/`` the compile tests
fail, naming the command that installs it (a skip would pass them without compiling anything).
Argument checks that need no compiler run in-process.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from seqmodels.mixers import MIXERS
from seqmodels.tools.aot import REPLY_PREFIX

ROOT = Path(__file__).resolve().parents[3]
LIBTPU = ROOT / ".libtpu"
TINY = ["model.d_model=128", "model.num_heads=4", "train.batch_size=8", "data.seq_len=256", "model.max_seq_len=8192"]
COMPILE_TIMEOUT = 1500


class AotServer:
    """One ``seqmodels.tools.aot --serve`` process, started on the first compile, answering in order."""

    def __init__(self, log_path: Path):
        self.log_path, self.process, self.replies = log_path, None, queue.Queue()

    def _start(self):
        if not (LIBTPU / "libtpu").is_dir():
            pytest.fail(f"libtpu is not installed in {LIBTPU}: bash scripts/setup.sh installs requirements-tpu.txt there")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(LIBTPU)]), "TPU_SKIP_MDS_QUERY": "1"}
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "seqmodels.tools.aot", "--serve"], cwd=ROOT, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)

        def read(stream=self.process.stdout):
            for line in stream:
                if line.startswith(REPLY_PREFIX):
                    self.replies.put(json.loads(line[len(REPLY_PREFIX):]))
            self.replies.put(None)  # the process ended

        threading.Thread(target=read, daemon=True).start()

    def compile(self, topology: str, config: str | None, overrides: list[str]) -> dict:
        """The report of one compile (fails the test on a refused or failed one)."""
        if self.process is None:
            self._start()
        request = {"topology": topology, "config": str(ROOT / config) if config else None, "overrides": overrides}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        try:
            reply = self.replies.get(timeout=COMPILE_TIMEOUT)
        except queue.Empty:
            pytest.fail(f"no reply within {COMPILE_TIMEOUT} s to {request}")
        if reply is None:
            pytest.fail(f"the aot server ended (status {self.process.wait()}):\n{self.log_path.read_text()[-4000:]}")
        assert "report" in reply, f"{request} failed: {reply.get('error')}\n{reply.get('traceback', '')[-4000:]}"
        return reply["report"]

    def close(self):
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(timeout=120)
            self.log.close()


@pytest.fixture(scope="module")
def aot(tmp_path_factory):
    server = AotServer(tmp_path_factory.mktemp("aot") / "server.log")
    yield server
    server.close()


def test_a_missing_topology_or_config_is_a_usage_error_not_a_trace(tmp_path):
    from seqmodels.tools.aot import main
    assert main(["--topology", "v5e:2x4", "--config", str(tmp_path / "missing.yaml")]) == 2
    with pytest.raises(SystemExit):
        main(["--config", "configs/transformer.yaml"])  # --topology is required
    with pytest.raises(SystemExit):
        main(["--serve", "--topology", "v5e:2x4"])  # a server takes each request's topology


def test_the_server_answers_a_refused_request_and_serves_the_next(tmp_path):
    """A bad request gets its error on its own reply line and the server goes on (no compiler needed)."""
    import io

    from seqmodels.tools.aot import serve
    missing = str(tmp_path / "missing.yaml")
    requests = io.StringIO("\n".join([json.dumps({"topology": "v5e:2x4", "config": missing}), "not json",
                                      json.dumps({"topology": "v5e:2x4", "colour": "red"}),
                                      json.dumps({"topology": "", "config": None})]) + "\n")
    replies = io.StringIO()
    assert serve(requests, replies) == 0
    lines = replies.getvalue().splitlines()
    assert len(lines) == 4 and all(line.startswith(REPLY_PREFIX) for line in lines)
    errors = [json.loads(line[len(REPLY_PREFIX):])["error"] for line in lines]
    assert "missing.yaml" in errors[0] and errors[1].startswith("Expecting value")
    assert "colour" in errors[2] and "topology must be a non-empty string" in errors[3]


@pytest.mark.slow
def test_mamba2_with_muon_compiles_for_v5e_through_the_mosaic_kernels(aot):
    """``kernel_impl`` and ``optim.muon_impl`` left at auto: on a TPU target the chunk_gla forward and
    backward kernels and the Newton-Schulz kernel are Mosaic calls in the compiled step."""
    report = aot.compile("v5e:2x2", "configs/mamba2.yaml",
                     TINY + ["model.mixers=[mamba2] * 2", "optim.name=muon", "model.compute_dtype=bfloat16"])
    assert report["device_kind"].startswith("TPU v5") and report["num_devices"] == 4
    assert report["mosaic_kernels"] >= 3  # chunk_gla forward + backward, Newton-Schulz
    assert report["temp_bytes"] > 0 and report["flops"] > 0 and report["peak_bytes"] > report["argument_bytes"] / 2


@pytest.mark.slow
def test_a_split_sequence_compiles_for_tpu_with_the_mosaic_kernels_inside_each_shard(aot):
    """``mesh.context=4``: the delta rule's state passing and the gathered attention lower for a v5e
    topology, the chunk kernels running on each shard's tokens (forward and backward of both passes)."""
    report = aot.compile("v5e:2x2", "configs/gated_deltanet.yaml",
                         TINY + ["model.mixers=[gated_deltanet, attention]", "model.remat=full", "mesh.data=1",
                                 "mesh.context=4", "model.compute_dtype=bfloat16"])
    assert report["mesh"] == {"data": 1, "fsdp": 1, "context": 4, "tensor": 1}
    assert report["mosaic_kernels"] >= 4 and report["temp_bytes"] > 0


@pytest.mark.slow
@pytest.mark.timeout(1800)  # twelve mixers: 9 minutes of compiling on 2 loaded cores
def test_every_registered_mixer_compiles_for_tpu_at_long_rows_per_chip_under_auto(aot):
    """One layer of each mixer in the registry (a newly registered one is compiled without a test of its
    own), one row of 8,192 tokens per chip (its features split over tensor 2) under fsdp x tensor with full remat
    (everything recomputed, the short convolutions too; Gated DeltaNet's remat-full compile over fsdp and tensor had a
    test of its own until 2026-12-08; this mesh compiled in 247 s against 282 s for fsdp 4, idle),
    ``model.kernel_impl`` and ``optim.muon_impl`` left at auto. At 8,192 tokens per chip the compiler once aborted
    (``TransformWindow: split of a padded window dim``, from the projections' dots: ``layers/common.Dense``).
    (Rows of 32,768 per chip were compiled here too until 2026-12-06: 13 minutes of the CI's 90 for the same
    programs at four times the length; ``benchmarks/results/context_memory`` has 350M rows at that length.)
    Each composed op resolves auto for itself, so Atlas's Newton-Schulz is the Mosaic kernel while its
    scans, which have no Mosaic kernel, are XLA (Atlas once passed the resolved ``pallas_tpu`` down to
    them and failed)."""
    mixers, seq_len = sorted(MIXERS), 8192
    report = aot.compile("v5e:2x2", "configs/atlas.yaml",
                         ["model.d_model=128", "model.num_heads=4", f"model.mixers=[{', '.join(mixers)}]",
                          "optim.name=muon", "model.compute_dtype=bfloat16", "model.remat=full", "mesh.data=1",
                          "mesh.fsdp=2", "mesh.tensor=2", "train.batch_size=2", f"data.seq_len={seq_len}",
                          f"model.max_seq_len={seq_len}", "model.atlas.poly_key_dim=4",
                          "model.atlas.memory_expansion=1"])
    assert report["mixers"] == mixers and report["batch_size"] * report["seq_len"] == 2 * seq_len
    assert report["num_devices"] == 4 and report["temp_bytes"] > 0 and report["flops"] > 0
    assert report["mesh"] == {"data": 1, "fsdp": 2, "context": 1, "tensor": 2}
    assert report["mosaic_kernels"] >= 3, report  # Newton-Schulz (Atlas, MuonSSM, Muon), the gated delta rule


@pytest.mark.slow
@pytest.mark.parametrize("config, mixer, heads, split_overrides, whole_rows", [
    ("configs/gated_deltanet.yaml", "gated_deltanet", 8, [], 2),
    ("configs/transformer.yaml", "attention", 16, ["model.attention.context_impl=ring"], 1),
], ids=["gated_deltanet", "transformer_ring"])
def test_a_row_split_over_eight_chips_needs_about_one_chips_memory_of_rows_an_eighth_as_long(
        aot, config, mixer, heads, split_overrides, whole_rows):
    """v5e-8: one row of 65,536 tokens under ``mesh.context=8`` (8,192 tokens per chip) against 8,192 tokens per
    chip in whole rows under fsdp: the split's per-chip peak stays within 1.5x. Gated DeltaNet adds the halo, the
    state chain and the all-gathered weights; Transformer++ by the ring adds its float32 accumulators and one query
    tile's scores per sub-block, against the unsplit step's splash kernel (benchmarks/results/context_memory
    has the 350M rows). The gather's ``[H, T / C, T]`` scores are not held to this: they do not fit.

    Gated DeltaNet's unsplit step is two rows of 4,096 per chip, the 350M row's width in remat full: without the
    optimisation barrier in the Mosaic rule's backward (pallas_kernels/gated_delta_rule/tpu.py) the TPU compiler
    aborts on it ("TransformWindow: split of a padded window dim is not supported"), which ends the aot server and
    fails this test. (That program had a test of its own until 2026-12-07; measured then, its peak was 1.950 GB
    against 1.948 GB for one row of 8,192 per chip.)"""
    # The 350M rows' width (d_model 1024, vocabulary 32768) in 2 scanned layers: at a toy width the state
    # chain's [K, K] transitions and widened pass outweigh the activations they sit beside.
    overrides = ["model.d_model=1024", f"model.num_heads={heads}", f"model.mixers=[{mixer}] * 2",
                 "model.vocab_size=32768", "model.scan_layers=true", "model.remat=full",
                 "model.compute_dtype=bfloat16", "model.max_seq_len=65536", "mesh.data=1"]
    whole = aot.compile("v5e:2x4", config, overrides + ["mesh.fsdp=8", f"train.batch_size={8 * whole_rows}",
                                                        f"data.seq_len={8192 // whole_rows}"])
    split = aot.compile("v5e:2x4", config, overrides + split_overrides
                        + ["mesh.context=8", "train.batch_size=1", "data.seq_len=65536"])
    assert split["mesh"]["context"] == 8 and whole["mesh"]["fsdp"] == 8
    assert whole["mosaic_kernels"] > 0 and split["mosaic_kernels"] >= (4 if mixer == "gated_deltanet" else 0)
    assert split["peak_bytes"] <= 1.5 * whole["peak_bytes"], (split["peak_bytes"], whole["peak_bytes"])


@pytest.mark.slow
def test_attention_memory_over_packed_rows_grows_linearly_in_seq_len(aot):
    """One attention layer over packed rows (segment ids), one row per chip: with splash attention
    (``auto`` on TPU) doubling T from 4096 to 8192 at most ~doubles the step's temporaries; the
    explicit-mask XLA path holds [H, T, T] float32 scores at T = 8192 (4 heads: 1 GiB), which the
    splash step's temporaries stay far below."""
    overrides = ["model.d_model=128", "model.num_heads=4", "model.mixers=[attention]", "model.max_seq_len=8192",
                 "train.batch_size=4", "model.compute_dtype=bfloat16"]
    temp = {}
    for seq_len in (4096, 8192):
        report = aot.compile("v5e:2x2", None, overrides + [f"data.seq_len={seq_len}"])
        assert report["mosaic_kernels"] >= 2, report  # splash forward and backward
        temp[seq_len] = report["temp_bytes"]
    xla = aot.compile("v5e:2x2", None, overrides + ["data.seq_len=8192", "model.attention.implementation=xla"])
    scores_bytes = 4 * 8192 * 8192 * 4
    assert temp[8192] / temp[4096] < 2.5, temp
    assert xla["temp_bytes"] >= scores_bytes and temp[8192] < scores_bytes / 8, (temp, xla["temp_bytes"])


@pytest.mark.slow
def test_sliding_window_attention_with_sinks_grows_linearly_in_seq_len(aot):
    """One ``swa`` layer with per-document sinks over packed rows, one row per chip: ``auto`` on TPU
    takes the banded form (plain XLA, no Mosaic call), whose step temporaries at most ~double from
    T = 4096 to 8192 and stay far below the [H, T, T] float32 scores of the explicit-mask path (the
    test above measures that path at 1 GiB and more for this shape), and whose FLOPs double (the
    masked path's attention FLOPs quadruple). ``temp_bytes`` counts HBM: XLA may place the band's
    scores (``[H, T, 2 * 128 + 4]`` float32 here) in VMEM, which is linear in T as well."""
    overrides = ["model.d_model=128", "model.num_heads=4", "model.mixers=[swa]", "model.swa.window=128",
                 "model.swa.num_sinks=4", "model.max_seq_len=8192", "train.batch_size=4",
                 "model.compute_dtype=bfloat16"]
    reports = {seq_len: aot.compile("v5e:2x2", None, overrides + [f"data.seq_len={seq_len}"])
               for seq_len in (4096, 8192)}
    temp = {seq_len: report["temp_bytes"] for seq_len, report in reports.items()}
    scores_bytes = 4 * 8192 * 8192 * 4
    assert all(report["mosaic_kernels"] == 0 for report in reports.values()), reports
    assert temp[8192] / temp[4096] < 2.5 and temp[8192] < scores_bytes / 8, temp
    assert reports[8192]["flops"] / reports[4096]["flops"] < 2.1, reports
