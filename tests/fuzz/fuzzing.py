"""Seeded mutation of the files each reader takes: truncations, byte flips, JSON values of the wrong type.

Every case must load or raise one of the project's own errors (``CLEAN``: each names the file); any
other exception is a failure, reported with the case that caused it. Seeds are fixed, so a failure
reproduces; ``FUZZ_CASES`` says how many cases a fast test runs, ``SLOW_CASES`` a slow one.
"""

import json
import random
import traceback
from pathlib import Path

from seqmodels.config_base import ConfigError
from seqmodels.data.errors import DataError
from seqmodels.errors import HFFormatError
from seqmodels.runs.checkpoints import CheckpointError

CLEAN = (HFFormatError, ConfigError, DataError, CheckpointError)
FUZZ_CASES = 40
SLOW_CASES = 400
# Byte positions where formats change meaning: the first byte, the end of a 4- or 8-byte length, ...
BOUNDARIES = (0, 1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 24, 25, 31, 32, 33, 63, 64, 65)


def truncations(data: bytes, rng: random.Random, count: int) -> list[tuple[str, bytes]]:
    """Prefixes of ``data``: at every boundary class (format boundaries, fractions, the last bytes), then random."""
    ends = {b for b in BOUNDARIES if b < len(data)}
    ends |= {len(data) * k // 8 for k in range(1, 8)} | {max(0, len(data) - k) for k in (1, 2, 4, 8)}
    ends = sorted(ends)
    while len(ends) < count and len(ends) < len(data):
        ends.append(rng.randrange(len(data)))
    return [(f"truncated to {end} of {len(data)} bytes", data[:end]) for end in ends[:count]]


def flips(data: bytes, rng: random.Random, count: int) -> list[tuple[str, bytes]]:
    """``data`` with 1-4 random bytes replaced; half the cases hit the first 256 bytes (headers, lengths)."""
    cases = []
    for _ in range(count):
        mutated = bytearray(data)
        positions = []
        for _ in range(rng.randint(1, 4)):
            span = min(len(data), 256) if rng.random() < 0.5 else len(data)
            position = rng.randrange(span)
            mutated[position] = rng.randrange(256)
            positions.append(position)
        cases.append((f"bytes changed at {positions}", bytes(mutated)))
    return cases


def byte_cases(data: bytes, seed: int, count: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    return truncations(data, rng, count // 2) + flips(data, rng, count - count // 2)


ODD_VALUES = (None, True, -1, 0, 2 ** 70, 1.5, -1e308, "", "x", "../../outside", "/etc/passwd", [], [1, "a"], {},
              {"a": {"b": [None]}})


def _paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree[:8]):
            yield from _paths(value, (*prefix, index))


def _replaced(tree, path, value, delete=False):
    if not path:
        return value
    copy = dict(tree) if isinstance(tree, dict) else list(tree)
    if len(path) == 1 and delete and isinstance(copy, dict):
        del copy[path[0]]
        return copy
    copy[path[0]] = _replaced(copy[path[0]], path[1:], value, delete)
    return copy


def value_cases(tree, seed: int, count: int) -> list[tuple[str, object]]:
    """``tree`` (parsed JSON / YAML) with one value replaced by one of another type, or a key deleted."""
    rng = random.Random(seed)
    paths = [p for p in _paths(tree) if p]
    cases = []
    for _ in range(count):
        path = rng.choice(paths)
        if rng.random() < 0.15:
            cases.append((f"{'.'.join(map(str, path))} deleted", _replaced(tree, path, None, delete=True)))
        else:
            value = rng.choice(ODD_VALUES)
            cases.append((f"{'.'.join(map(str, path))} = {value!r}", _replaced(tree, path, value)))
    return cases


def json_cases(path: Path, seed: int, count: int) -> list[tuple[str, bytes]]:
    """Byte mutations of the JSON file ``path`` and value mutations of its content, half each."""
    data = path.read_bytes()
    values = value_cases(json.loads(data), seed, count // 2)
    return byte_cases(data, seed, count - count // 2) + [(label, json.dumps(tree).encode()) for label, tree in values]


def failures(cases, write, read) -> list[str]:
    """Run ``write(case bytes)`` then ``read()`` for each case; the cases whose ``read`` raised anything but ``CLEAN``."""
    found = []
    for label, data in cases:
        write(data)
        try:
            read()
        except CLEAN as error:
            assert str(error).strip(), f"{label}: an empty error message"
        except Exception:  # noqa: BLE001  (the point: anything else is a failure)
            found.append(f"{label}:\n{traceback.format_exc(limit=-3)}")
    return found


def tree_snapshot(directory: Path) -> set[Path]:
    return {p.relative_to(directory) for p in Path(directory).rglob("*")}
