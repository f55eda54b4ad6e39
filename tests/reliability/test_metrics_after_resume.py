"""After a resume, metrics.jsonl and TensorBoard read as one curve: the rows of steps after the restored one go."""

import shutil
import struct
from pathlib import Path

import pytest

import train as train_entry
from conftest import tiny_overrides
from reliability_helpers import logged_losses, logged_steps
from seqmodels.training.metrics import drop_rows_after


def _events(path: Path):
    """The ``Event`` records of a TensorBoard event file (TFRecord framing: length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2
    data, offset, events = path.read_bytes(), 0, []
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        event = event_pb2.Event()
        event.ParseFromString(data[offset + 12: offset + 12 + length])
        events.append(event)
        offset += 12 + length + 4
    return events


def test_drop_rows_after_keeps_earlier_rows_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.0}\n{"step": 3, "loss": 1.0}\n{"step": 4, "lo')
    assert drop_rows_after(path, 2) == 2
    assert path.read_text() == '{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.0}\n'
    assert drop_rows_after(path, 2) == 0


@pytest.mark.slow  # two training runs
def test_steps_logged_after_the_last_checkpoint_are_not_logged_twice(tmp_path, tiny_corpus, capsys):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, tiny_corpus, train__steps=10)
    assert train_entry.main(overrides) == 0
    first = logged_losses(run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "10")  # as if killed after logging step 10, before saving it
    (run_dir / "run.lock").write_text('{"pid": 999999, "host": "elsewhere"}')  # and its lock left behind
    capsys.readouterr()
    assert train_entry.main(overrides) == 0
    assert "stale lock" in capsys.readouterr().out
    assert logged_steps(run_dir) == list(range(1, 11))
    assert logged_losses(run_dir) == first  # the recomputed steps are bitwise the same
    newest = max((run_dir / "tb").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)
    starts = [e.step for e in _events(newest) if e.HasField("session_log") and e.session_log.status == 1]
    assert starts == [6]  # SessionLog.START at step 6: TensorBoard discards the old run's events from step 6 on
