"""benchmarks/tpu_aot.py's cases: every (T, mesh.context) pair holds ``rows-per-chip x T / C`` tokens per chip."""

import pytest

from benchmarks import tpu_aot


def overrides_dict(overrides):
    return dict(item.split("=", 1) for item in overrides)


def test_a_context_case_splits_each_row_over_context_chips_and_keeps_the_tokens_per_chip():
    whole = overrides_dict(tpu_aot.case_overrides("gated_deltanet", "350m", 8, seq_len=8192, context=1,
                                                  rows_per_chip=1))
    split = overrides_dict(tpu_aot.case_overrides("gated_deltanet", "350m", 8, seq_len=65536, context=8,
                                                  rows_per_chip=1))
    assert (whole["train.batch_size"], whole["mesh.context"], whole["data.seq_len"]) == ("8", "1", "8192")
    assert (split["train.batch_size"], split["mesh.context"], split["data.seq_len"]) == ("1", "8", "65536")
    assert split["model.max_seq_len"] == "65536" and split["mesh.fsdp"] == "-1"
    default = overrides_dict(tpu_aot.case_overrides("transformer", "1b", 8))
    assert (default["train.batch_size"], default["data.seq_len"], default["mesh.context"]) == ("16", "4096", "1")


def test_a_context_that_does_not_divide_the_row_or_the_rows_is_refused_before_any_compile(capsys):
    with pytest.raises(ValueError, match="must divide"):
        tpu_aot.case_overrides("transformer", "350m", 8, seq_len=1000, context=3)
    with pytest.raises(SystemExit):
        tpu_aot.main(["--archs", "transformer", "--sizes", "350m", "--topologies", "v5e:2x4", "--seq-lens", "4096",
                      "--contexts", "16", "--rows-per-chip", "1"])
    assert "mesh.context must divide" in capsys.readouterr().err


def test_the_table_names_the_length_context_tokens_per_chip_and_whose_flops_of_each_row():
    row = {"arch": "gated_deltanet", "size": "350m", "topology": "v5e:2x4", "seq_len": 65536, "context": 8,
           "tokens_per_chip": 8192, "device_kind": "TPU v5 lite", "num_devices": 8, "num_params": 338e6,
           "argument_bytes": 2**30, "output_bytes": 2**30, "temp_bytes": 2**31, "peak_bytes": 3 * 2**30,
           "flops": 2e12, "mosaic_kernels": 2, "compile_seconds": 100}
    failed = {"arch": "transformer", "size": "350m", "topology": "v5e:2x4", "seq_len": 131072, "context": 8,
              "tokens_per_chip": 16384, "error": "CompileTimeHbmOom"}
    registry = {**row, "model_flops": 9e13}
    table = tpu_aot.markdown([row, failed, registry]).splitlines()
    assert table[2].startswith("| gated_deltanet | 350m | v5e:2x4 (TPU v5 lite x 8) | 65536 | 8 | 8192 | 338M |")
    assert "| 3.00 | 2.0 (XLA) |" in table[2]  # XLA's count, marked: it sees a loop body once
    assert "| 3.00 | 90.0 |" in table[4]  # the FLOPs registry's count where the row has it
    assert table[3].startswith("| transformer | 350m | v5e:2x4 | 131072 | 8 | 16384 | failed: CompileTimeHbmOom")


def test_a_failed_compile_keeps_the_compilers_reason_without_the_machines_paths():
    """The error of a row (committed in the results) names no absolute path of this machine."""
    stderr = "\n".join(["W0000 a warning",
                        f'  File "{tpu_aot.ROOT}/.venv/lib/python3.12/site-packages/jax/x.py", line 4',
                        "    raise e", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM"])
    error = tpu_aot.compiler_error(stderr)
    assert str(tpu_aot.ROOT) not in error and "W0000" not in error
    assert '".venv/lib/python3.12/site-packages/jax/x.py"' in error
    assert error.splitlines()[-1].endswith("Ran out of memory on HBM")
