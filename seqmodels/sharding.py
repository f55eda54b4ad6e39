"""Meshes, logical axis names and the one rules table that maps them to mesh axes.

Model code names *logical* axes only (``batch``, ``embed``, ``heads`` ...): parameters carry them as
``logical_axes`` metadata (see ``seqmodels.layers.common.param``) and activations are constrained
with ``constrain(x, ("batch", "seq", "embed"))``. ``RULES`` below is the only place that says which
mesh axis (``data``, ``fsdp``, ``context``, ``tensor``) a logical axis is split over:

    batch      -> (data, fsdp)   sequences are split over every data-parallel axis
    seq        -> context        each row's tokens are split into contiguous shards (context parallelism)
    embed      -> (fsdp, context) parameters (and their optimizer state) are sharded over fsdp and context on
                                 their model dimension: a context shard holds its share of the weights
                                 as an fsdp shard does (MaxText's rule), all-gathered for each matmul
    mlp, heads, kv_heads, vocab -> tensor
    everything else (head_dim, state, conv, layers, ...) -> replicated

A mesh axis is used at most once per spec, the first logical axis claiming it winning: an activation
``("batch", "seq", "embed")`` keeps its model dimension whole (batch took fsdp, seq took context).

Under ``mesh.context > 1`` the operations that mix tokens run per shard with explicit collectives
(``seqmodels.layers.context``); everything token-wise (projections, MLPs, norms, the loss) is plain
SPMD over the sharded sequence.

A dimension whose size the mesh axes do not divide is left replicated (``logical_spec`` with
``shape``), so small models still run on large meshes.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from flax.nnx import traversals
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# The order lays the axes out on the interconnect: the innermost (tensor, then context) get the fastest links.
MESH_AXES = ("data", "fsdp", "context", "tensor")
# The mesh axis a row's tokens are split over; only seqmodels.layers.context names it inside shard_map.
SEQUENCE_AXIS = "context"

RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "seq": (SEQUENCE_AXIS,),
    "embed": ("fsdp", SEQUENCE_AXIS),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "vocab": ("tensor",),
}


def make_mesh(mesh_config, devices: Sequence | None = None) -> Mesh:
    """A ``(data, fsdp, context, tensor)`` mesh over ``devices`` (default: all) laid out on the interconnect.

    One size may be -1 (fill). Within a slice (ICI) ``mesh_utils.create_device_mesh`` orders the
    devices by the physical topology (TPU torus, GPU NVLink islands; plain order on CPU), so the
    tensor axis, the innermost, gets the fastest links. ``mesh.dcn_*`` > 1 makes that many ways of an
    axis run across slices or hosts (``create_hybrid_device_mesh``; on GPU and CPU each process is
    one such granule): data parallelism over DCN, fsdp and tensor within a slice, as MaxText lays out
    multi-slice meshes.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [mesh_config.data, mesh_config.fsdp, getattr(mesh_config, "context", 1), mesh_config.tensor]
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"mesh: {len(devices)} devices cannot be split into {sizes}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"mesh: sizes data={sizes[0]} fsdp={sizes[1]} context={sizes[2]} tensor={sizes[3]} multiply to "
                         f"{int(np.prod(sizes))}, but there are {len(devices)} devices")
    dcn = [getattr(mesh_config, f"dcn_{axis}", 1) for axis in MESH_AXES]
    if all(ways == 1 for ways in dcn):
        grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES)
    if any(size % ways for size, ways in zip(sizes, dcn)):
        raise ValueError(f"mesh: the DCN ways {dcn} must divide the axis sizes {sizes}")
    within = [size // ways for size, ways in zip(sizes, dcn)]
    by_process = not hasattr(devices[0], "slice_index")
    granules = len({d.process_index for d in devices}) if by_process else len({d.slice_index for d in devices})
    if int(np.prod(dcn)) != granules:
        raise ValueError(f"mesh: dcn_data x dcn_fsdp x dcn_context x dcn_tensor = {int(np.prod(dcn))} must equal the number "
                         f"of {'processes' if by_process else 'slices'}, {granules}")
    grid = mesh_utils.create_hybrid_device_mesh(within, dcn, devices, process_is_granule=by_process,
                                                allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES)


def logical_spec(names: Sequence[str | None], shape: Sequence[int] | None = None,
                 mesh: Mesh | None = None) -> PartitionSpec:
    """PartitionSpec for logical axis ``names``; with ``shape`` and ``mesh``, skip splits that do not divide.

    A mesh axis is used at most once per spec: the first logical axis that claims it gets it.
    """
    used: set[str] = set()
    spec = []
    for i, name in enumerate(names):
        axes = [a for a in RULES.get(name, ()) if a not in used] if name else []
        if mesh is not None:
            axes = [a for a in axes if dict(mesh.shape).get(a, 1) > 1]
        if shape is not None and mesh is not None and axes:
            if shape[i] % int(np.prod([mesh.shape[a] for a in axes])):
                axes = []
        used.update(axes)
        spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    return PartitionSpec(*spec)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """``with_sharding_constraint`` by logical names under the mesh set by ``jax.set_mesh``; else ``x``."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, mesh))


def kernel_spec(names: Sequence[str | None], shape: Sequence[int]) -> PartitionSpec | None:
    """The ``partition_spec`` a ``pallas_kernels`` op needs for an input of logical ``names``, or None off-mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return None
    return logical_spec(names, shape, mesh)


def _logical_axes(variable: nnx.Variable, path) -> tuple:
    axes = variable.get_metadata().get("logical_axes")
    if axes is None or len(axes) != np.ndim(variable.get_value()):
        raise ValueError(f"parameter {'/'.join(map(str, path))} of shape {np.shape(variable.get_value())} "
                         f"has logical_axes={axes}; every parameter needs one logical axis name per dimension "
                         "(create it with seqmodels.layers.common.param)")
    return tuple(axes)


def param_logical_axes(state: nnx.State) -> dict:
    """Every parameter's logical axes, as a pure nested dict of tuples."""
    return traversals.unflatten_mapping(
        {path: _logical_axes(variable, path) for path, variable in nnx.to_flat_state(state)})


def param_shardings(state: nnx.State, mesh: Mesh) -> dict:
    """NamedShardings for every parameter of ``state`` (an ``nnx.State``), as a pure nested dict."""
    shardings = {}
    for path, variable in nnx.to_flat_state(state):
        spec = logical_spec(_logical_axes(variable, path), np.shape(variable.get_value()), mesh)
        shardings[path] = NamedSharding(mesh, spec)
    return traversals.unflatten_mapping(shardings)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a ``[batch, seq, ...]`` input array: batch over the data-parallel axes, the sequence
    over ``context`` (tokens, targets, segment ids, positions and the loss mask travel together)."""
    return NamedSharding(mesh, logical_spec(("batch", "seq") + (None,) * (ndim - 2), mesh=mesh))


def sequence_shards() -> int:
    """How many contiguous shards a row's tokens are split into under the current mesh (1 off-mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    return int(dict(mesh.shape).get(SEQUENCE_AXIS, 1))
