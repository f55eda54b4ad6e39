"""One process per run directory: an exclusive lock naming its owner, taken before anything is read or written.

``run_dir/run.lock`` holds ``{"pid", "host", "started"}`` of the owner and an exclusive ``flock`` for the
owner's lifetime. The kernel drops the ``flock`` when the owner dies (``kill -9`` included), so a lock
file left behind by a dead process is *stale*: the next run takes it over and says whose it was. A
live owner's lock refuses the second run with the owner's pid and host. On release the file is removed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_NAME = "run.lock"


class RunDirError(ValueError):
    """The run directory cannot be used: it is a file, not writable, full, or owned by another run."""


def _os_problem(path: Path, action: str, error: OSError) -> RunDirError:
    hints = {errno.ENOSPC: "the disk is full; free space or choose another train.run_dir",
             errno.EROFS: "the file system is read-only; choose another train.run_dir",
             errno.EACCES: "permission denied; choose a train.run_dir you can write",
             errno.EPERM: "permission denied; choose a train.run_dir you can write",
             errno.ENOTDIR: "a parent of it is a file, not a directory; choose another train.run_dir"}
    hint = hints.get(error.errno, "choose another train.run_dir")
    return RunDirError(f"cannot {action} {path}: {error.strerror or error}; {hint}")


class RunDirLock:
    """``with RunDirLock(run_dir, message=print):`` holds ``run_dir/run.lock``; raises ``RunDirError``."""

    def __init__(self, run_dir, message=print):
        self.run_dir, self.message = Path(run_dir), message
        self.path = self.run_dir / LOCK_NAME
        self._fd = None

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise RunDirError(f"train.run_dir={self.run_dir} is a file, not a directory; choose another train.run_dir")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise _os_problem(self.run_dir, "create the run directory", error) from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise _os_problem(self.path, "create the lock file", error) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise RunDirError(
                    f"{self.run_dir} is in use by another run (pid {owner.get('pid', '?')} on host "
                    f"{owner.get('host', '?')}, started {owner.get('started', '?')}); wait for it to finish, stop it, "
                    "or choose another train.run_dir") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the owner removed the file between our open and our flock: take the new one
        previous = _read_owner(fd)
        if previous:
            self.message(f"taking over the stale lock {self.path} of pid {previous.get('pid', '?')} on host "
                         f"{previous.get('host', '?')} (started {previous.get('started', '?')}), which no longer "
                         "holds it")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)
            os.fsync(fd)
        except OSError as error:
            self.path.unlink(missing_ok=True)  # ours (we hold its flock): leave the directory as it was
            os.close(fd)
            raise _os_problem(self.path, "write the lock file", error) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a lock file left behind is stale (its flock is released below) and is taken over
        os.close(self._fd)
        self._fd = None


def _read_owner(fd) -> dict:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace")
        owner = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {"pid": "unknown (unreadable lock file)"}
    return owner if isinstance(owner, dict) else {}


def _same_file(fd, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
