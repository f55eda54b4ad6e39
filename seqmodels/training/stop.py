"""Stopping on SIGTERM / SIGINT at a step boundary (imports nothing heavy, so it can be installed first)."""

from __future__ import annotations

import signal

from seqmodels.training.streams import write_fd


class StopFlag:
    """Set by SIGTERM / SIGINT; the loop checkpoints and stops at the next step boundary.

    Installed as ``train`` starts, so a signal during set-up or the first compile also stops cleanly
    (before any step, nothing is saved). A second signal restores the previous handlers and re-raises
    it: Ctrl-C twice stops at once, without saving.
    """

    def __init__(self):
        self.signal_name = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.signal_name is not None:
            self.restore()
            signal.raise_signal(signum)
            return
        self.signal_name = signal.Signals(signum).name
        # os.write, not print: a handler may run while the main thread is inside a print of its own.
        write_fd(2, f"{self.signal_name} received: stopping after this step with a checkpoint; send it again "
                    "to stop at once without saving\n")  # a closed stderr drops the message, never the run

    def settle(self):
        """The run is over (its files written, its status decided): a signal from now until the process
        exits changes neither, so the handled signals are ignored instead of restored."""
        for s in self._previous:
            signal.signal(s, signal.SIG_IGN)

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
