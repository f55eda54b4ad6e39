"""The pieces that free a run from its topology: a process's rows of the global batch, one global data
position in a checkpoint, the resume's topology line, and the single-process stop decision."""

import json
import signal

import numpy as np
import pytest

from seqmodels.config import CheckpointConfig, DataConfig
from seqmodels.data.pipeline import make_train_dataset
from seqmodels.runs.checkpoints import CheckpointError
from seqmodels.training.agreed_stop import AgreedStop
from seqmodels.training.batches import ProcessRows
from seqmodels.training.checkpoint import Checkpointer
from seqmodels.runs.checkpoint_check import step_problems
from seqmodels.training.loop import topology_note
from seqmodels.training.stop import StopFlag


def test_the_blocks_of_every_process_tile_the_global_batch_and_share_its_position():
    dataset = make_train_dataset(DataConfig(seq_len=16), batch_size=6)
    whole = iter(dataset)
    parts = [iter(dataset.map(ProcessRows(shard, 3, 6))) for shard in range(3)]
    for _ in range(2):
        batch, blocks = next(whole), [next(part) for part in parts]
        for key in batch:
            np.testing.assert_array_equal(np.concatenate([b[key] for b in blocks]), batch[key])
    assert all(part.get_state() == whole.get_state() for part in parts)
    resumed = iter(dataset.map(ProcessRows(1, 2, 6)))
    resumed.set_state(whole.get_state())  # a position saved by 1 process (or 3) continues on 2
    np.testing.assert_array_equal(next(resumed)["inputs"], next(whole)["inputs"][3:])


def test_process_rows_refuse_uneven_blocks_and_a_batch_of_other_size():
    with pytest.raises(ValueError, match="cannot be split into 4 equal blocks"):
        ProcessRows(0, 4, 6)
    with pytest.raises(ValueError, match=r"shard must be an int in \[0, 2\)"):
        ProcessRows(2, 2, 6)
    with pytest.raises(ValueError, match="has 4 rows, expected the global 6"):
        ProcessRows(0, 2, 6)({"inputs": np.zeros((4, 3))})


def _data_files(tmp_path, states: list[dict]):
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(), read_only=True)
    data = tmp_path / "checkpoints" / "7" / "data"
    data.mkdir(parents=True)
    for index, state in enumerate(states):
        (data / f"process_{index}-of-{len(states)}.json").write_text(json.dumps(state))
    return checkpointer


def test_a_global_data_position_continues_on_any_process_count(tmp_path):
    checkpointer = _data_files(tmp_path, [{"offset": 5}, {"offset": 5}])
    assert checkpointer.data_state(7) == {"offset": 5}  # this test process is process 0 of 1


def test_per_process_positions_are_refused_on_another_process_count(tmp_path):
    checkpointer = _data_files(tmp_path, [{"offset": 5}, {"offset": 9}])
    with pytest.raises(CheckpointError, match=r"written by 2 process\(es\), each at its own position.*resume with 2"):
        checkpointer.data_state(7)


def test_a_step_is_checked_for_the_data_files_of_the_processes_that_wrote_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "process_0-of-3.json").write_text("{}")
    (data / "process_2-of-3.json").write_text("{")
    problems = step_problems(tmp_path, process_count=1)
    assert "data/process_1-of-3.json is missing" in problems
    assert "data/process_2-of-3.json is not readable JSON (truncated?)" in problems
    assert not any("process_0-of-1" in p for p in problems)


def test_the_resume_logs_the_old_and_the_new_topology():
    old = {"processes": 2, "devices": 4, "mesh": {"data": 4, "fsdp": 1, "tensor": 1}}
    new = {"processes": 1, "devices": 2, "mesh": {"data": 2, "fsdp": 1, "tensor": 1}}
    note = topology_note(old, new, 5)
    assert "step 5 was saved by 2 process(es) x 4 devices, mesh {'data': 4" in note
    assert "resuming on 1 process(es) x 2 devices, mesh {'data': 2" in note
    assert topology_note(new, new, 5) == "topology: 1 process(es) x 2 devices, mesh {'data': 2, 'fsdp': 1, 'tensor': 1}, as when step 5 was saved"
    assert "before topologies were recorded" in topology_note(None, new, 5)


def test_one_process_stops_after_the_step_during_which_a_signal_came_and_sighup_counts():
    stop = StopFlag()
    try:
        agreed = AgreedStop(stop)
        assert not agreed.should_stop(1)
        signal.raise_signal(signal.SIGHUP)
        assert agreed.should_stop(2) and stop.reason == "SIGHUP" and stop.signal_number == signal.SIGHUP
    finally:
        stop.restore()
