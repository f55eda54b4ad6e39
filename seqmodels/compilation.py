"""The persistent XLA compilation cache every entry point uses, and a record of what each process compiled.

A compiled program is written to a directory keyed by its HLO, the compiler options, the devices and the
jax / XLA versions; a later process that builds the same program (a run resumed after a preemption, an
evaluation of a finished run, the next variant of a sweep) reads it back instead of compiling. The
executable read back is the one that was written, so the numbers it computes are bitwise those of a fresh
compile.

Where the cache lives: ``train.compilation_cache`` for ``train.py``; ``SEQMODELS_COMPILATION_CACHE`` for
every entry point, benchmark and experiment (and as the default of ``train.compilation_cache``); else
``~/.cache/seqmodels/xla``. An empty value turns the cache off. Clearing it is deleting the directory: nothing
else refers to it, and the next process compiles afresh and fills it again.

No size limit is set: with one, jax takes a file lock and reads the size and last use of every entry on every
write, a cost that grows with the directory (the test suite writes about 5,000 programs a session). Without the
lock, a process that reads an entry another is still writing gets a warning from jax and compiles it itself.

``CompileRecord`` listens to jax's monitoring events while it is open and sums what XLA spent on
compiles (``/jax/core/compile/backend_compile_duration``, which includes reading an executable back from
the cache), how many programs were requested from the cache and how many it served.
"""

from __future__ import annotations

import os
from pathlib import Path

from seqmodels.config_base import ConfigError

ENVIRONMENT_VARIABLE = "SEQMODELS_COMPILATION_CACHE"
DEFAULT_DIRECTORY = "~/.cache/seqmodels/xla"

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_REQUESTED = "/jax/compilation_cache/compile_requests_use_cache"
_SERVED = "/jax/compilation_cache/cache_hits"


def default_compilation_cache() -> str:
    """``$SEQMODELS_COMPILATION_CACHE`` if it is set (an empty value: no cache), else ``~/.cache/seqmodels/xla``."""
    return os.environ.get(ENVIRONMENT_VARIABLE, DEFAULT_DIRECTORY)


def use_compilation_cache(directory: str | None = None) -> Path | None:
    """Point this process's jax at the persistent compilation cache in ``directory`` (``~`` expanded;
    ``None``: ``default_compilation_cache()``; ``''``: no cache); returns the directory used, or None.

    Every program is cached however quickly it compiled (jax's default keeps only those over a second):
    a run's small programs add up, and each entry is a few kilobytes. A directory that cannot be created
    raises ``ConfigError`` naming it. Calling again with another directory moves the cache there."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    directory = default_compilation_cache() if directory is None else directory
    if not isinstance(directory, str):
        raise TypeError(f"the compilation cache directory must be a string (a path, or '' for none), got "
                        f"{type(directory).__name__}")
    path = Path(directory).expanduser() if directory else None
    if path is not None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"cannot create the compilation cache directory {path} ({error.strerror or error}); "
                             f"point it ({ENVIRONMENT_VARIABLE}, or train.compilation_cache for train.py) at a "
                             "writable directory, or set it to '' to compile without a cache") from None
    current = jax.config.jax_compilation_cache_dir
    wanted = None if path is None else str(path)
    if current != wanted:
        jax.config.update("jax_compilation_cache_dir", wanted)
        compilation_cache.reset_cache()  # jax opens its cache once per process: reopen it at the new place
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


class CompileRecord:
    """What XLA compiled while the record was open (a context manager): seconds, programs, cache hits.

    ``seconds`` is XLA's backend time, reading an executable back from the cache included; ``trace_seconds``
    is tracing and lowering to StableHLO, which no cache saves. ``programs`` counts backend compiles,
    ``requested`` those that asked the persistent cache and ``served`` those it answered."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory
        self.seconds = self.trace_seconds = 0.0
        self.programs = self.requested = self.served = 0

    def _on_duration(self, event: str, duration: float, **_) -> None:
        if event == _BACKEND_COMPILE:
            self.seconds += duration
            self.programs += 1
        elif event in (_TRACE, _LOWER):
            self.trace_seconds += duration

    def _on_event(self, event: str, **_) -> None:
        if event == _REQUESTED:
            self.requested += 1
        elif event == _SERVED:
            self.served += 1

    def __enter__(self) -> CompileRecord:
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring
        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)

    def as_metrics(self) -> dict[str, float]:
        """The record as metrics: ``compile_seconds``, ``trace_seconds``, ``compiled_programs``, ``cache_served``."""
        return {"compile_seconds": self.seconds, "trace_seconds": self.trace_seconds,
                "compiled_programs": self.programs, "cache_served": self.served}

    def describe(self) -> str:
        """``compiles: 12 program(s) in 3.40 s of XLA (10 of 12 read back from the persistent cache at DIR);
        tracing and lowering 1.20 s``."""
        directory = self.directory
        if directory is None:
            where = "the persistent compilation cache is off"
        elif not self.requested:
            where = f"none went through the persistent cache at {directory}"
        else:
            where = f"{self.served} of {self.requested} read back from the persistent cache at {directory}"
        return (f"compiles: {self.programs} program(s) in {self.seconds:.2f} s of XLA ({where}); tracing and "
                f"lowering {self.trace_seconds:.2f} s")
