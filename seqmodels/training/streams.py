"""stdout and stderr that go quiet when their reader closes them (``train.py ... | head -1``, a dropped ssh).

A closed pipe is the reader's choice, not the run's failure: the messages stop, the metrics, TensorBoard
files and checkpoints (written to the run directory) go on, and the exit status is the run's own.
``with quiet_when_closed():`` replaces ``sys.stdout`` and ``sys.stderr`` by ``QuietStream`` wrappers; the
first write that finds the reader gone points the file descriptor at ``/dev/null``, so later writes (a
logging handler, the interpreter's last flush, a C library writing to fd 2) succeed unseen.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

# What a write to a reader that has gone away raises: EPIPE (a closed pipe), EIO / ENXIO (a hung-up terminal).
GONE = (errno.EPIPE, errno.EIO, errno.ENXIO, errno.EBADF)


def is_reader_gone(error: BaseException) -> bool:
    return isinstance(error, OSError) and (isinstance(error, BrokenPipeError) or error.errno in GONE)


class QuietStream:
    """A text stream whose ``write`` and ``flush`` never raise because the reader went away."""

    def __init__(self, stream):
        self.stream = stream
        self.reader_gone = False

    def _silence(self) -> None:
        self.reader_gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self.stream.write(text)
            except OSError as error:
                if not is_reader_gone(error):
                    raise
                self._silence()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.reader_gone:
            return
        try:
            self.stream.flush()
        except OSError as error:
            if not is_reader_gone(error):
                raise
            self._silence()

    def isatty(self) -> bool:
        return not self.reader_gone and self.stream.isatty()

    def __getattr__(self, name):  # fileno, encoding, errors, buffer, ...: the wrapped stream's
        return getattr(self.stream, name)


def write_fd(fd: int, text: str) -> None:
    """``os.write`` (safe inside a signal handler) that drops the text when the reader has gone away."""
    try:
        os.write(fd, text.encode())
    except OSError as error:
        if not is_reader_gone(error):
            raise


@contextlib.contextmanager
def quiet_when_closed():
    """``sys.stdout`` and ``sys.stderr`` as ``QuietStream`` for the duration; restored after."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = QuietStream(sys.stdout), QuietStream(sys.stderr)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = saved
