"""Metrics sinks: TensorBoard event files (encoded in ``event_records``, no TensorFlow), a JSONL log, a progress bar."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

from seqmodels.config import LogConfig
from seqmodels.errors import writing
from seqmodels.training import event_records


def drop_rows_after(path, step: int) -> int:
    """Remove the rows of ``path`` (a metrics JSONL) logged after ``step``; returns how many went.

    A run killed after its last checkpoint logged steps that the resumed run computes again; dropping
    them keeps one row per step. The file is replaced atomically (a torn last line is dropped too).
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            dropped += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        temporary = path.with_name(path.name + ".tmp")
        with writing(temporary):
            temporary.write_text("".join(line + "\n" for line in kept))
        temporary.replace(path)
    return dropped


class EventFile:
    """TensorBoard scalars in one event file, written in the caller's thread.

    tensorboardX's ``SummaryWriter`` writes from a background thread and closes from an ``atexit`` hook: a
    full disk there prints thread and exit tracebacks after the run's own message, and the caller sees a
    reasonless error later. Here every write and flush happens where it is called, and an ``OSError``
    names the event file. ``purge_step`` (a resumed run) tells TensorBoard to discard the events a previous
    run logged from that step on, as ``SummaryWriter(purge_step=...)`` does.
    """

    def __init__(self, directory, *, purge_step: int | None = None):
        directory = Path(directory)
        with writing(directory):
            directory.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self.path, number = directory / name, 1
        while self.path.exists():  # a resumed run within the same second: a file of its own, not an overwrite
            number += 1
            self.path = directory / f"{name}.{number}"
        with writing(self.path):
            self._file = open(self.path, "xb")
        self._write(event_records.event(time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(event_records.event(time.time(), purge_step, session_start=True))
        self.flush()

    def _write(self, payload: bytes) -> None:
        with writing(self.path):
            self._file.write(event_records.record(payload))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._write(event_records.event(time.time(), step, scalars={tag: float(value)}))

    def flush(self) -> None:
        with writing(self.path):
            self._file.flush()

    def close(self) -> None:
        with writing(self.path):
            self._file.close()


class MetricsLogger:
    """``log(step, metrics)`` writes every sink; the progress bar shows loss and tokens/s.


    Rows of steps after ``start_step`` left by an interrupted run are dropped from ``metrics.jsonl``,
    and TensorBoard is told to discard its events from step ``start_step + 1`` on (``purge_step``), so
    both read as one curve after a resume.

    In a run of several processes only process 0 (``primary``) writes metrics, TensorBoard events,
    the progress bar and messages; the others log nothing (the metrics are global values, the same
    on every process).
    """

    def __init__(self, run_dir, config: LogConfig, *, total_steps: int, start_step: int, primary: bool = True):
        run_dir = Path(run_dir)
        self.primary = primary
        if primary:
            drop_rows_after(run_dir / "metrics.jsonl", start_step)
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.jsonl = open(self.jsonl_path, "a") if primary else None
        self.writer = None
        if config.tensorboard and primary:
            self.writer = EventFile(run_dir / "tb", purge_step=start_step + 1)
        show = config.progress == "always" or (config.progress == "auto" and sys.stderr.isatty())
        self.bar = None
        if show and primary:
            from tqdm import tqdm
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict) -> None:
        if self.jsonl is None:
            return
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        with writing(self.jsonl_path):
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(f"train/{key}", float(value), step)
            self.writer.flush()

    def advance(self, step: int, loss: float, tokens_per_second: float) -> None:
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_second:,.0f}", refresh=False)
            self.bar.refresh()

    def message(self, text: str) -> None:
        if not self.primary:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Close every sink; a sink that fails to close (a full disk) does not keep the others open."""
        if self.bar is not None:
            self.bar.close()
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            if self.jsonl is not None:
                with writing(self.jsonl_path):
                    self.jsonl.close()
