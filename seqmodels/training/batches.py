"""Global batches from per-process data: which rows each process keeps, and how they become one array.

Every process draws the same global batch of step s (the data pipeline with the global batch size, a
function of the data settings and s alone) and keeps the block of rows its devices hold
(``ProcessRows``); the data position is therefore the same on every process and does not depend on
their number, so a checkpoint resumes on any number of processes.

The batch ``[B, T]`` is split over the mesh axes ``data x fsdp`` on its rows and over ``context`` on
its tokens (``seqmodels.sharding.batch_sharding``), and replicated over ``tensor``. A process must feed exactly the rows its own devices hold. When
every process's devices hold a distinct block of rows, the blocks are the *data shards* and
process p reads shard p. When the tensor (or any replicated) axis spans processes, several
processes hold the same rows: they form one shard and must read the same data. ``data_shard``
finds this process's shard and the number of shards from the sharding itself, so any mesh loads
correctly, and refuses a layout in which a process's rows are not one contiguous block.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding

from seqmodels.config import ConfigError


def _row_block(indices, rows: int) -> tuple[int, int]:
    start, stop, _ = indices[0].indices(rows)
    return start, stop


def data_shard(sharding: NamedSharding, rows: int) -> tuple[int, int]:
    """``(shard index, number of shards)`` of this process for a ``[rows, ...]`` batch under ``sharding``."""
    blocks: dict[int, set] = {}
    # columns: any multiple of the sequence axis's shards (the mesh size is one), so a split sequence fits
    for device, indices in sharding.devices_indices_map((rows, sharding.mesh.size)).items():
        blocks.setdefault(device.process_index, set()).add(_row_block(indices, rows))
    spans = {}
    for process, held in blocks.items():
        start, stop = min(b[0] for b in held), max(b[1] for b in held)
        covered = np.zeros(stop - start, bool)
        for a, b in held:
            covered[a - start:b - start] = True
        if not covered.all():
            raise ConfigError(f"mesh: process {process}'s devices hold rows {sorted(held)} of the batch, not one "
                              "contiguous block; order the mesh so that each process holds consecutive rows "
                              "(mesh.dcn_data / mesh.dcn_fsdp across processes)")
        spans[process] = (start, stop)
    shards = sorted(set(spans.values()))
    sizes = {stop - start for start, stop in shards}
    ends = [stop for _, stop in shards]
    if len(sizes) != 1 or [start for start, _ in shards] != [0, *ends[:-1]] or ends[-1] != rows:
        raise ConfigError(f"mesh: the processes hold the row blocks {shards} of a {rows}-row batch; they must "
                          "tile it in equal blocks")
    return shards.index(spans[jax.process_index()]), len(shards)


def global_batch(batch: dict, sharding: NamedSharding, rows: int) -> dict:
    """One global ``[rows, ...]`` array per field from this process's shard of the batch."""
    return {key: jax.make_array_from_process_local_data(sharding, np.asarray(value), (rows, *np.shape(value)[1:]))
            for key, value in batch.items()}


class ProcessRows:
    """``batch -> batch[shard * rows : (shard + 1) * rows]`` for every field: this process's block of a global batch."""

    def __init__(self, shard: int, shards: int, global_rows: int):
        if not isinstance(shards, int) or shards < 1 or global_rows % shards:
            raise ValueError(f"a {global_rows}-row batch cannot be split into {shards} equal blocks")
        if not isinstance(shard, int) or not 0 <= shard < shards:
            raise ValueError(f"shard must be an int in [0, {shards}), got {shard!r}")
        rows = global_rows // shards
        self.start, self.stop, self.global_rows = shard * rows, (shard + 1) * rows, global_rows

    def __call__(self, batch: dict) -> dict:
        for key, value in batch.items():
            if np.shape(value)[0] != self.global_rows:
                raise ValueError(f"batch field {key!r} has {np.shape(value)[0]} rows, expected the global "
                                 f"{self.global_rows}")
        return {key: np.asarray(value)[self.start:self.stop] for key, value in batch.items()}
