"""Metrics sinks: TensorBoard event files (tensorboardX, no TensorFlow), a JSONL log, a progress bar."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from seqmodels.config import LogConfig


class MetricsLogger:
    """``log(step, metrics)`` writes every sink; the progress bar shows loss and tokens/s.

    In a run of several processes only process 0 (``primary``) writes metrics, TensorBoard events,
    the progress bar and messages; the others log nothing (the metrics are global values, the same
    on every process).
    """

    def __init__(self, run_dir, config: LogConfig, *, total_steps: int, start_step: int, primary: bool = True):
        run_dir = Path(run_dir)
        self.primary = primary
        self.jsonl = open(run_dir / "metrics.jsonl", "a") if primary else None
        self.writer = None
        if config.tensorboard and primary:
            from tensorboardX import SummaryWriter
            self.writer = SummaryWriter(str(run_dir / "tb"))
        show = config.progress == "always" or (config.progress == "auto" and sys.stderr.isatty())
        self.bar = None
        if show and primary:
            from tqdm import tqdm
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict) -> None:
        if self.jsonl is None:
            return
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
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
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        if self.jsonl is not None:
            self.jsonl.close()
