"""Multi-process runs on JAX's own runtime: joining a cluster, and starting N local processes as one.

Scale-out is JAX's multi-controller model: one process per host (per GPU node, per TPU VM), each
running the same program, joined by ``jax.distributed.initialize`` and exchanging data through
XLA collectives. ``initialize_distributed`` joins when this process is one of several:

- ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0), ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID`` are set (by the user, a job script, or ``python -m seqmodels.launch``);
- or a cluster JAX detects by itself: a SLURM job step with more than one task
  (``SLURM_NTASKS > 1``), or a multi-host Cloud TPU slice (``TPU_WORKER_HOSTNAMES`` names several
  hosts; ``MEGASCALE_COORDINATOR_ADDRESS`` for multi-slice).

A single process on a single host does nothing: ``jax.devices()`` is then this host's devices.

``python -m seqmodels.launch --processes N [--devices-per-process D] -- train.py ARGS`` starts N
processes on this machine, each with D CPU devices and the three variables above, over CPU
collectives (gloo): a cluster of N hosts in miniature, for tests and for trying a multi-host mesh
without one. Each line a process prints is prefixed with ``[process i]``; the launcher exits with
the first non-zero status of its processes (and stops the others), or 0.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading

ADDRESS, COUNT, INDEX = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"


def cluster_detected(environ=os.environ) -> bool:
    """Whether ``environ`` describes one process of several (module docstring)."""
    if environ.get(ADDRESS):
        return True
    if int(environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_JOB_ID" in environ:
        return True
    hosts = [h for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return len(hosts) > 1 or bool(environ.get("MEGASCALE_COORDINATOR_ADDRESS"))


def initialize_distributed(environ=os.environ) -> bool:
    """Join the JAX cluster when this process is one of several; returns whether it did.

    Must run before anything touches a device (``jax.devices()``, a computation).
    """
    if not cluster_detected(environ):
        return False
    import jax

    if environ.get(ADDRESS):
        missing = [name for name in (COUNT, INDEX) if not environ.get(name)]
        if missing:
            raise ValueError(f"{ADDRESS} is set but {', '.join(missing)} is not: set the number of processes "
                             f"({COUNT}) and this process's index ({INDEX}, 0 .. {COUNT} - 1) too")
        jax.distributed.initialize(coordinator_address=environ[ADDRESS], num_processes=int(environ[COUNT]),
                                   process_id=int(environ[INDEX]))
    else:
        jax.distributed.initialize()
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_environment(index: int, processes: int, devices: int, port: int, environ=os.environ) -> dict:
    """The environment of local process ``index``: the cluster variables and ``devices`` CPU devices."""
    flags = [f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    return {**environ, ADDRESS: f"127.0.0.1:{port}", COUNT: str(processes), INDEX: str(index),
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])}


def _relay(stream, prefix: str, sink) -> None:
    for line in iter(stream.readline, ""):
        sink.write(f"{prefix}{line}")
        sink.flush()
    stream.close()


def launch(command: list[str], *, processes: int, devices_per_process: int = 1, port: int | None = None,
           timeout: float | None = None) -> int:
    """Run ``python COMMAND`` as ``processes`` local processes of one cluster; the first non-zero status or 0."""
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if not isinstance(devices_per_process, int) or devices_per_process < 1:
        raise ValueError(f"devices_per_process must be an int >= 1, got {devices_per_process!r}")
    if not command:
        raise ValueError("no command to launch: give it after --, e.g. -- train.py train.steps=10")
    port = port or _free_port()
    children, relays = [], []
    for index in range(processes):
        child = subprocess.Popen([sys.executable, *command], text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                 env=process_environment(index, processes, devices_per_process, port))
        children.append(child)
        for stream, sink in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
            relay = threading.Thread(target=_relay, args=(stream, f"[process {index}] ", sink), daemon=True)
            relay.start()
            relays.append(relay)
    status = _wait_all(children, timeout)
    for relay in relays:
        relay.join(timeout=5)
    return status


def _wait_all(children, timeout) -> int:
    """Wait for every child; on the first failure (or the timeout) stop the rest."""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    status = 0
    while any(child.poll() is None for child in children):
        failed = [child.returncode for child in children if child.returncode not in (None, 0)]
        expired = deadline is not None and time.monotonic() > deadline
        if failed or expired:
            status = failed[0] if failed else 124
            for child in children:
                if child.poll() is None:
                    child.terminate()
            for child in children:
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
            break
        time.sleep(0.2)
    codes = [child.returncode for child in children]
    return status or next((code for code in codes if code), 0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m seqmodels.launch --processes N [--devices-per-process D] -- train.py ARGS",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m seqmodels.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, required=True, help="local processes to start (N)")
    parser.add_argument("--devices-per-process", type=int, default=1, help="CPU devices of each process (D)")
    parser.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before every process is stopped")
    args = parser.parse_args(argv[:split])
    try:
        return launch(argv[split + 1:], processes=args.processes, devices_per_process=args.devices_per_process,
                      port=args.port, timeout=args.timeout)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
