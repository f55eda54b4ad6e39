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
without one. Each line a process prints is prefixed with ``[process i]``. The launcher waits on
every process; SIGTERM, SIGINT and SIGHUP sent to it are forwarded to all of them; when one fails
the others are stopped (a few seconds to stop by themselves, then SIGTERM, then SIGKILL), and
processes whose launcher dies are killed, so none is left behind. It exits with the first failing
status (``128 + N`` for a process killed by signal N), or 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

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
    timeouts = cluster_timeouts(environ)
    import jax

    if environ.get(ADDRESS):
        missing = [name for name in (COUNT, INDEX) if not environ.get(name)]
        if missing:
            raise ValueError(f"{ADDRESS} is set but {', '.join(missing)} is not: set the number of processes "
                             f"({COUNT}) and this process's index ({INDEX}, 0 .. {COUNT} - 1) too")
        jax.distributed.initialize(coordinator_address=environ[ADDRESS], num_processes=int(environ[COUNT]),
                                   process_id=int(environ[INDEX]), **timeouts)
    else:
        jax.distributed.initialize(**timeouts)
    return True


def cluster_timeouts(environ=os.environ) -> dict:
    """How soon a lost process stops the others: ``heartbeat_timeout_seconds`` (``SEQMODELS_HEARTBEAT_TIMEOUT``,
    default 10) and ``shutdown_timeout_seconds`` (``SEQMODELS_SHUTDOWN_TIMEOUT``, default 30).

    A process that stops sending heartbeats for the heartbeat timeout is declared lost by the
    coordination service, and every other process terminates naming it; JAX's defaults (100 s and
    300 s) leave the survivors blocked in a collective for minutes.
    """
    timeouts = {}
    for name, key, default in (("SEQMODELS_HEARTBEAT_TIMEOUT", "heartbeat_timeout_seconds", 10),
                               ("SEQMODELS_SHUTDOWN_TIMEOUT", "shutdown_timeout_seconds", 30)):
        text = environ.get(name, "") or str(default)
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{name}={text!r} must be a whole number of seconds >= 1")
        timeouts[key] = int(text)
    return timeouts


def free_port() -> int:
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


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PREEMPTED = 3  # train.py's status after a stop every process agreed on: the others are stopping too
GRACE_SECONDS = 5.0  # after a process fails: how long the others may take to stop on their own, then after SIGTERM


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: ``128 + N`` for death by signal N, else the exit code."""
    return 128 - returncode if returncode < 0 else returncode


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGKILL when the launcher dies, however it dies (Linux only)."""
    os.setpgrp()  # its own process group: a terminal's Ctrl-C reaches the launcher, which forwards it once
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_DEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os._exit(1)


def launch(command: list[str], *, processes: int, devices_per_process: int = 1, port: int | None = None,
           timeout: float | None = None, grace: float = GRACE_SECONDS) -> int:
    """Run ``python COMMAND`` as ``processes`` local processes of one cluster; returns the first failing status or 0.

    SIGTERM, SIGINT and SIGHUP sent to the launcher are forwarded to every process. When a process
    fails (non-zero status or a signal), the others get ``grace`` seconds to stop by themselves, then
    SIGTERM and ``grace`` more, then SIGKILL; the launcher returns once no process is left. A signal death reads
    ``128 + N``; ``timeout`` seconds after the start every process is stopped and the status is 124.
    """
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if not isinstance(devices_per_process, int) or devices_per_process < 1:
        raise ValueError(f"devices_per_process must be an int >= 1, got {devices_per_process!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if not grace >= 0:
        raise ValueError(f"grace must be a number of seconds >= 0, got {grace!r}")
    if not command:
        raise ValueError("no command to launch: give it after --, e.g. -- train.py train.steps=10")
    port = port or free_port()
    children, relays = [], []
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in FORWARDED}
    try:
        for index in range(processes):
            child = subprocess.Popen([sys.executable, *command], text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                     env=process_environment(index, processes, devices_per_process, port))
            children.append(child)
            for stream, sink in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
                relay = threading.Thread(target=_relay, args=(stream, f"[process {index}] ", sink), daemon=True)
                relay.start()
                relays.append(relay)
        status = _wait_all(children, timeout, received, grace)
    finally:
        for child in children:  # an error while starting them (or in the launcher itself) leaves none behind
            if child.poll() is None:
                child.kill()
                child.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
    for relay in relays:
        relay.join(timeout=5)
    return status


def _send(children, signum) -> None:
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)


def _wait_all(children, timeout, received: list[int], grace: float) -> int:
    """Wait for every child, forwarding the signals in ``received``; on the first failure (or the timeout)
    stop the rest: ``grace`` seconds to stop by themselves, then SIGTERM, then SIGKILL."""
    deadline = None if timeout is None else time.monotonic() + timeout
    status, stopping = 0, None  # stopping: (when the grace began, whether SIGTERM was sent)
    while [child.poll() for child in children].count(None):  # polls every child, not up to the first live one
        while received:
            _send(children, received.pop(0))
        if status == 0:
            failed = [exit_status(child.returncode) for child in children if child.returncode not in (None, 0)]
            if failed:
                status = failed[0]
                index = next(i for i, child in enumerate(children) if child.returncode not in (None, 0))
                code = children[index].returncode
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                if [child.returncode for child in children].count(None) and code != PREEMPTED:
                    print(f"launch: process {index} {how}; stopping the others", file=sys.stderr, flush=True)
            elif deadline is not None and time.monotonic() > deadline:
                status = 124
        if status and stopping is None:
            stopping = (time.monotonic(), False)
        if stopping is not None:
            since, terminated = stopping
            waited = time.monotonic() - since
            if not terminated and (waited > grace or status == 124):
                _send(children, signal.SIGTERM)
                stopping = (time.monotonic(), True)
            elif terminated and waited > grace:
                _send(children, signal.SIGKILL)
        time.sleep(0.05)
    codes = [exit_status(child.returncode) for child in children]
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
    parser.add_argument("--grace", type=float, default=GRACE_SECONDS,
                        help="after a process fails, seconds the others get to stop by themselves (then SIGTERM)")
    args = parser.parse_args(argv[:split])
    try:
        return launch(argv[split + 1:], processes=args.processes, devices_per_process=args.devices_per_process,
                      port=args.port, timeout=args.timeout, grace=args.grace)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
