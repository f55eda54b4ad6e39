"""TensorBoard event records encoded by seqmodels.training.event_records, byte for byte tensorboardX's."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from seqmodels.training import event_records

ROOT = Path(__file__).resolve().parents[3]


def test_crc32c_gives_the_castagnoli_check_value():
    assert event_records.crc32c(b"123456789") == 0xE3069283
    assert event_records.crc32c(b"") == 0


@pytest.mark.parametrize("step, tag, value", [
    (0, "train/loss", 5.25), (7, "train/grad_norm", 0.0), (2**40, "train/loss", -1.5), (3, "x", math.nan),
    (3, "x", -math.inf), (3, "x", 1e39), (3, "x", -1e39), (-4, "/eval/a b:c", 2.0), (1, "train/ü", 1e-40),
])
def test_a_scalar_event_is_tensorboardx_s_serialization(step, tag, value):
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.summary import scalar
    expected = Event(wall_time=1700000000.125, step=step, summary=scalar(tag, value)).SerializeToString()
    assert event_records.event(1700000000.125, step, scalars={tag: value}) == expected


def test_the_file_version_and_session_start_events_are_tensorboardx_s_serialization():
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    assert (event_records.event(12.5, file_version="brain.Event:2")
            == Event(wall_time=12.5, file_version="brain.Event:2").SerializeToString())
    assert (event_records.event(12.5, 6, session_start=True)
            == Event(wall_time=12.5, step=6, session_log=SessionLog(status=SessionLog.START)).SerializeToString())


def test_records_are_framed_as_tensorboardx_s_record_writer_frames_them(tmp_path):
    from tensorboardX.record_writer import RecordWriter
    payloads = [b"", b"a", bytes(range(256)) * 3, event_records.event(1.0, 2, scalars={"loss": 3.0})]
    writer = RecordWriter(str(tmp_path / "theirs"))
    for payload in payloads:
        writer.write(payload)
    writer.close()
    assert b"".join(map(event_records.record, payloads)) == (tmp_path / "theirs").read_bytes()


def test_a_bad_event_is_refused_with_its_reason():
    with pytest.raises(ValueError, match="exactly one of"):
        event_records.event(1.0, 1, file_version="v", session_start=True)
    with pytest.raises(ValueError, match="exactly one of"):
        event_records.event(1.0, 1)
    with pytest.raises(ValueError, match="step must be an int64"):
        event_records.event(1.0, 2**63, session_start=True)
    with pytest.raises(ValueError, match="wall_time must be a finite number"):
        event_records.event(math.nan, 1, session_start=True)
    with pytest.raises(TypeError, match="tag must be a str"):
        event_records.event(1.0, 1, scalars={3: 1.0})
    with pytest.raises(TypeError, match="payload must be bytes"):
        event_records.record("text")


def test_logging_to_tensorboard_imports_neither_tensorboardx_nor_torch(tmp_path):
    """A run's metrics reach TensorBoard without tensorboardX, whose package imports torch (~2 s a process)."""
    script = ("import sys\nfrom seqmodels.config import LogConfig\n"
              "from seqmodels.training.metrics import MetricsLogger\n"
              f"logger = MetricsLogger({str(tmp_path)!r}, LogConfig(progress='never', tensorboard=True), total_steps=2,"
              " start_step=0)\nlogger.log(1, {'loss': 2.0})\nlogger.close()\n"
              "print(sorted(name for name in ('torch', 'tensorboardX') if name in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
