"""A reader that closes stdout / stderr silences the messages, never the run; a signal after the last step changes nothing."""

import io
import os
import signal
import subprocess
import sys

import pytest

import train as train_entry
from conftest import tiny_overrides, write_corpus
from reliability_helpers import ROOT, logged_steps, subprocess_env
from seqmodels.runs.checkpoints import RunCheckpoints
from seqmodels.training.checkpoint import Checkpointer
from seqmodels.training.stop import StopFlag
from seqmodels.training.streams import QuietStream, write_fd


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_quiet_stream_swallows_a_closed_reader_but_not_other_errors():
    quiet = QuietStream(_ClosedPipe())
    assert quiet.write("lost") == 4 and quiet.reader_gone
    quiet.flush()
    print("and after", file=quiet)  # quiet from now on

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        QuietStream(Full()).write("x")


def test_a_signal_handler_message_to_a_closed_stderr_is_dropped():
    read, write = os.pipe()
    os.close(read)
    try:
        write_fd(write, "SIGTERM received\n")  # EPIPE: dropped, no exception into the interrupted code
    finally:
        os.close(write)


def test_signals_after_settle_are_ignored():
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop = StopFlag()
        stop.settle()
        os.kill(os.getpid(), signal.SIGTERM)  # would end this process with 143 if it were not ignored
        assert stop.signal_name is None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return str(write_corpus(tmp_path_factory.mktemp("streams") / "corpus") / "*.txt")


@pytest.mark.slow
def test_closed_stdout_and_stderr_let_the_run_finish_with_its_metrics_and_checkpoints(tmp_path, corpus):
    """As ``python train.py ... 2>&1 | head -1``: the reader takes the first line and goes away."""
    run = tmp_path / "run"
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                                *tiny_overrides(run, corpus, train__steps=6, checkpoint__every_steps=3)],
                               cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    first = process.stdout.readline()
    assert first.startswith("model:")
    process.stdout.close()
    process.stderr.close()
    assert process.wait(timeout=300) == 0
    assert logged_steps(run) == list(range(1, 7))
    checkpoints = RunCheckpoints(run)
    try:
        assert checkpoints.steps() == [3, 6]
    finally:
        checkpoints.close()


@pytest.mark.slow
def test_a_sigterm_while_the_last_checkpoint_is_written_changes_nothing(tmp_path, corpus, monkeypatch, capsys):
    wait = Checkpointer.wait

    def signalled_wait(self):
        if self.last_saved == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # after the last step, as the run finishes
        wait(self)

    monkeypatch.setattr(Checkpointer, "wait", signalled_wait)
    run = tmp_path / "run"
    assert train_entry.main(tiny_overrides(run, corpus, train__steps=4, checkpoint__every_steps=2)) == 0
    captured = capsys.readouterr()
    assert "done: steps 1..4" in captured.out and "stopped by" not in captured.err
    assert logged_steps(run) == [1, 2, 3, 4]
