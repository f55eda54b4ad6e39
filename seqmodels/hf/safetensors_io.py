"""Read and write safetensors checkpoints (one file, or shards listed by ``model.safetensors.index.json``).

The format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the bytes after the header), then the
raw little-endian data. Read here with numpy memory maps, so bfloat16 (``ml_dtypes``, which jax ships)
is read as well as float32 and nothing is loaded that is not asked for.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from seqmodels.errors import HFFormatError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 2 * 1024**3  # above this a checkpoint is split into shards (as transformers does)
DTYPES = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
          "BF16": np.dtype(ml_dtypes.bfloat16)}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def read_header(path: Path) -> tuple[dict, int]:
    """``(header, data_start)`` of the safetensors file ``path``; ``HFFormatError`` if it is not one.

    Every entry is checked: a known layout (``dtype`` a string, ``shape`` non-negative integers,
    ``data_offsets`` ``[begin, end]`` within the file's data), so a damaged header is refused here.
    """
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > size - 8:
                raise ValueError(f"its header claims {length} bytes but the file holds {size}: truncated?")
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError) as error:
        raise HFFormatError(f"{path}: not a readable safetensors file ({error})") from None
    if not isinstance(header, dict):
        raise HFFormatError(f"{path}: not a readable safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        problem = _entry_problem(entry, size - 8 - length)
        if problem:
            raise HFFormatError(f"{path}: tensor {name!r}: {problem}; the file is damaged or not safetensors")
    return header, 8 + length


def _is_count(value) -> bool:
    return type(value) is int and value >= 0


def _entry_problem(entry, data_bytes: int) -> str | None:
    if not isinstance(entry, dict):
        return f"its entry is {entry!r}, not an object"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(entry.get("dtype"), str):
        return f"dtype {entry.get('dtype')!r} is not a name"
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        return f"shape {shape!r} is not a list of sizes"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(n) for n in offsets):
        return f"data_offsets {offsets!r} is not [begin, end]"
    if not offsets[0] <= offsets[1] <= data_bytes:
        return f"data_offsets {offsets} lie outside the file's {data_bytes} data bytes (truncated?)"
    return None


def shard_path(directory: Path, shard, index: Path) -> Path:
    """The file of shard name ``shard`` listed in ``index``: a plain file name inside ``directory``, never a path
    that leaves it (``../x``, ``/etc/x``, ``sub/x``)."""
    if not isinstance(shard, str) or not shard or shard in (".", "..") or Path(shard).name != shard \
            or "\\" in shard or "\0" in shard:
        raise HFFormatError(f"{index}: shard {shard!r} is not a file name in {directory}; an index lists the "
                            "shards beside it")
    return directory / shard


class SafetensorsCheckpoint:
    """The tensors of a Hugging Face directory: ``names()``, ``shape(name)``, ``read(name) -> np.ndarray``."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self._files = self._tensor_files()
        self._headers = {file: read_header(file) for file in set(self._files.values())}
        for name, file in self._files.items():
            if name not in self._headers[file][0]:
                raise HFFormatError(f"{file}: tensor {name!r} listed in {self.directory / INDEX_FILE} is not in it")

    def _tensor_files(self) -> dict[str, Path]:
        index, single = self.directory / INDEX_FILE, self.directory / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise HFFormatError(f"{index}: not a safetensors index (needs a 'weight_map'): {error}") from None
            if not isinstance(weight_map, dict) or not weight_map:
                raise HFFormatError(f"{index}: 'weight_map' must map tensor names to shard files, got "
                                    f"{str(weight_map)[:100]}")
            files = {name: shard_path(self.directory, shard, index) for name, shard in weight_map.items()}
            for shard in sorted(set(files.values())):
                if not shard.is_file():
                    raise HFFormatError(f"{index}: shard {shard.name} is missing from {self.directory}")
            return files
        if single.is_file():
            return {name: single for name in read_header(single)[0]}
        raise HFFormatError(f"{self.directory}: no {SINGLE_FILE} and no {INDEX_FILE}")

    def names(self) -> list[str]:
        return sorted(self._files)

    def file_of(self, name: str) -> Path:
        return self._files[name]

    def shape(self, name: str) -> tuple[int, ...]:
        header, _ = self._headers[self._files[name]]
        return tuple(header[name]["shape"])

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a numpy array of its stored dtype."""
        file = self._files[name]
        header, start = self._headers[file]
        entry = header[name]
        if entry["dtype"] not in DTYPES:
            raise HFFormatError(f"{file}: tensor {name!r} has dtype {entry['dtype']}; readable: {', '.join(DTYPES)}")
        dtype, (begin, end) = DTYPES[entry["dtype"]], entry["data_offsets"]
        count = int(np.prod(entry["shape"], dtype=np.int64))
        if end - begin != count * dtype.itemsize:
            raise HFFormatError(f"{file}: tensor {name!r} holds {end - begin} bytes, its shape {entry['shape']} "
                                f"needs {count * dtype.itemsize}")
        try:
            data = np.memmap(file, dtype=dtype, mode="r", offset=start + begin, shape=(count,))
        except (OSError, ValueError) as error:
            raise HFFormatError(f"{file}: tensor {name!r} cannot be read ({error}); is the file truncated?") from None
        return np.array(data).reshape(entry["shape"])


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write ``tensors`` (name -> float array) to ``path`` in the safetensors format, names sorted."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    arrays = {name: np.ascontiguousarray(tensors[name]) for name in sorted(tensors)}
    for name, array in arrays.items():
        if array.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} cannot be written; one of {list(DTYPE_NAMES)}")
        header[name] = {"dtype": DTYPE_NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        for array in arrays.values():
            handle.write(array.tobytes())


def write_checkpoint(directory: Path, tensors: dict[str, np.ndarray], *,
                     max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """``model.safetensors``, or shards ``model-0000k-of-0000n.safetensors`` and the index when the tensors
    exceed ``max_shard_bytes``; returns the file names written."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    total = sum(array.nbytes for array in tensors.values())
    if total <= max_shard_bytes:
        write_safetensors(directory / SINGLE_FILE, tensors)
        return [SINGLE_FILE]
    shards, size = [{}], 0
    for name in sorted(tensors):
        if shards[-1] and size + tensors[name].nbytes > max_shard_bytes:
            shards, size = shards + [{}], 0
        shards[-1][name] = tensors[name]
        size += tensors[name].nbytes
    weight_map, names = {}, []
    for number, shard in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(directory / file, shard)
        weight_map.update(dict.fromkeys(shard, file))
        names.append(file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names + [INDEX_FILE]
