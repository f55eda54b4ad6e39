"""One step at which every process of a run stops, wherever the stop was requested.

A stop is requested on one process (SIGTERM, SIGINT or SIGHUP reaches it: ``StopFlag``) or
announced by JAX's coordination service (a preemption notice). Were each process to stop on its own
flag, one would wait in the checkpoint's barrier while another waits in its next step's collective,
for ever. So after each step is dispatched, each process contributes its flag (the signal number, 0
for none) to a one-element-per-device maximum over all devices: the maximum dispatched after step
``s`` is read after step ``s + 1`` is dispatched (when step ``s``'s metrics are read anyway, so the
host never waits for it alone), and every process then stops after step ``s + 1``. The preemption
sync point (``multihost_utils.reached_preemption_sync_point``) is the service's own agreed step and
stops every process at that step. A single process stops after the step during which its flag was set.
"""

from __future__ import annotations

import signal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from seqmodels.training.stop import StopFlag


class AgreedStop:
    """``should_stop(step)`` after dispatching ``step``: True on every process at the same step."""

    def __init__(self, stop: StopFlag):
        self.stop = stop
        self.processes = jax.process_count()
        self._pending = None
        if self.processes > 1:
            mesh = Mesh(np.asarray(jax.devices()), ("processes",))
            self._flags = NamedSharding(mesh, PartitionSpec("processes"))
            self._max = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, PartitionSpec()))

    def _dispatch(self) -> jax.Array:
        local = np.asarray([self.stop.signal_number], np.int32)
        shards = [jax.device_put(local, device) for device in self._flags.addressable_devices]
        return self._max(jax.make_array_from_single_device_arrays((len(jax.devices()),), self._flags, shards))

    def should_stop(self, step: int) -> bool:
        """Whether every process stops after ``step`` (call once per step, on every process, in order)."""
        if self.processes == 1:
            return self.stop.signal_name is not None
        if _preemption_sync_point(step):
            self._agree("the coordination service's preemption notice")
            return True
        previous, self._pending = self._pending, self._dispatch()
        if previous is None:
            return False
        code = int(jax.device_get(previous))
        if code:
            self._agree(f"{signal.Signals(code).name} on another process")
        return bool(code)

    def _agree(self, elsewhere: str) -> None:
        if self.stop.signal_name is None:
            self.stop.elsewhere = elsewhere


def _preemption_sync_point(step: int) -> bool:
    try:
        return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:  # no preemption service in this runtime
        return False
