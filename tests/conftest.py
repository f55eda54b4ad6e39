"""Test-wide set-up: 8 simulated CPU devices for the sharding tests (must precede importing jax)."""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# LAPACK calls (the delta-rule triangular solves) with multi-threaded OpenBLAS spin-wait on a busy
# CPU and run ~1000x slower; XLA's own thread pool is unaffected.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# No persistent compilation cache: the suite has no use for it, and a worker that runs out of memory
# mappings (see `_release_compiled_executables`) crashed inside LoadedExecutable.serialize while writing it.
# transformers copies an export's remote-code modules into this cache when loading it; one per test process,
# so two workers never write and import the same copies at once.
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="hf_modules_")  # not inherited: xdist workers each set theirs

import gc  # noqa: E402
import random  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
    """Drop every compiled executable after a test module once they hold a quarter of the mapping limit.

    An XLA CPU executable holds about three memory mappings of JIT code until jax's caches let it go, and an
    xdist worker runs hundreds of modules: past Linux's ``vm.max_map_count`` (65,530 by default) the next
    compile cannot map its code and the worker aborts or segfaults inside ``backend_compile_and_load``.
    Clearing only past a quarter keeps the executables that later modules reuse for as long as it is safe.
    """
    yield
    limit, mapped = _memory_mappings()
    if mapped <= limit // 4:
        return
    import jax

    jax.clear_caches()
    gc.collect()
    limit, mapped = _memory_mappings()
    if mapped > limit // 2:
        pytest.fail(f"{mapped} memory mappings are still held after this module's executables were released "
                    f"(vm.max_map_count is {limit}): something keeps compiled functions alive across modules")


def _memory_mappings() -> tuple[int, int]:
    """(vm.max_map_count, mappings this process holds); zero mappings where /proc does not say."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps") as f:
            return limit, sum(1 for _ in f)
    except OSError:
        return 1, 0


def write_corpus(directory, num_files: int = 24, seed: int = 0):
    """Small deterministic text documents (made-up Python-like lines) under ``directory``."""
    rng = random.Random(seed)
    words = ["def", "return", "value", "index", "for", "in", "range", "if", "else", "self", "data", "x", "y"]
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(num_files):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(rng.randint(3, 30))]
        (directory / f"doc_{i:03d}.txt").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def tiny_corpus(tmp_path):
    """A glob over a generated corpus of 24 small text files."""
    return str(write_corpus(tmp_path / "corpus") / "*.txt")


def tiny_overrides(run_dir, corpus_glob, **extra):
    """Overrides of a model and run small enough to train in seconds on CPU."""
    values = {
        "model.d_model": 32, "model.num_heads": 2, "model.mixers": "[attention] * 2", "model.max_seq_len": 64,
        "data.source": "text_files", "data.path": corpus_glob, "data.seq_len": 32, "data.heldout_fraction": 0.2,
        "train.batch_size": 8, "train.steps": 20, "train.run_dir": str(run_dir),
        "optim.warmup_steps": 2, "log.every_steps": 1, "log.progress": "never", "log.tensorboard": True,
        "checkpoint.every_steps": 5, "checkpoint.async_save": False,
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]
