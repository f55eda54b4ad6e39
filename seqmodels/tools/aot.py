"""Compile the sharded train step for a TPU topology ahead of time, on a CPU machine.

    python -m seqmodels.tools.aot --topology v5e:2x4 --config configs/X.yaml [key.sub=value ...]
    python -m seqmodels.tools.aot --topology v5p:2x2x2 --config configs/X.yaml --json out.json
    python -m seqmodels.tools.aot --serve      # compile request after request, one process (see serve)

The topology (``jax.experimental.topologies.get_topology_desc``) gives abstract TPU devices; the mesh
of ``mesh.*`` is laid out on them, the train state and a batch of ``train.batch_size x data.seq_len``
tokens become ``ShapeDtypeStruct``s with the shardings training uses, and the real train step
(``seqmodels.training.step``, the optimizer of ``optim.*``) is lowered and compiled by XLA's TPU
compiler. Nothing runs. Printed per chip: argument, output, temporary and generated-code bytes
(``compiled.memory_analysis()``), their peak sum (arguments + outputs + temporaries - aliased), and the
FLOPs XLA counts (``compiled.cost_analysis()``, per chip).

Needs ``libtpu`` (``pip install -r requirements-tpu.txt``, or into a separate directory put on
``PYTHONPATH``) and ``TPU_SKIP_MDS_QUERY=1`` outside a TPU VM (set here if unset, as is ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``
so that several processes may compile at once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

TOPOLOGY_HELP = ("TPU topology name as jax.experimental.topologies takes it, e.g. v5e:2x4 (v5e-8), "
                 "v5p:2x2x2 (v5p-16: 8 chips), v4:2x2x1")


def topology_devices(topology: str) -> list:
    """The abstract TPU devices of ``topology``; a clear error without libtpu or for a bad name."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no TPU VM metadata server to ask
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several compiling processes (pytest -n 2)
    from jax.experimental import topologies
    try:
        description = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    except Exception as error:  # libtpu raises RuntimeError / ValueError / XlaRuntimeError variously
        raise ValueError(f"cannot describe TPU topology {topology!r} ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); is libtpu installed "
                         f"(requirements-tpu.txt)? {TOPOLOGY_HELP}") from error
    return list(description.devices)


def abstract_train_inputs(config, mesh):
    """``(step_fn, state, batch, state_shardings, batch_sharding)``: the train step and its inputs as
    ``ShapeDtypeStruct``s carrying the shardings ``seqmodels.training.loop`` uses."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from seqmodels.optim.build import build_optimizer
    from seqmodels.sharding import batch_sharding as sequence_batch_sharding, param_logical_axes, param_shardings
    from seqmodels.models import abstract_model
    from seqmodels.training.state import optimizer_state_shardings
    from seqmodels.training.step import make_train_step

    graphdef, abstract_state = abstract_model(config.model, config.train.seed)
    params = nnx.to_pure_dict(abstract_state)
    optimizer, schedule = build_optimizer(config.optim, config.train.steps,
                                          param_axes=param_logical_axes(abstract_state),
                                          param_shapes=jax.tree.map(lambda x: tuple(x.shape), params))
    shardings = param_shardings(abstract_state, mesh)
    abstract_opt = jax.eval_shape(optimizer.init, params)
    replicated = NamedSharding(mesh, PartitionSpec())
    state_shardings = {"step": replicated, "params": shardings,
                       "opt_state": optimizer_state_shardings(abstract_opt, params, shardings, mesh)}
    plain_state = {"step": jax.ShapeDtypeStruct((), "int32"), "params": params, "opt_state": abstract_opt}
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), plain_state,
                         state_shardings)
    batch_sharding = sequence_batch_sharding(mesh)
    rows = (config.train.batch_size, config.data.seq_len)
    batch = {name: jax.ShapeDtypeStruct(rows, "int32", sharding=batch_sharding)
             for name in ("inputs", "targets", "segment_ids", "positions")}
    batch["loss_mask"] = jax.ShapeDtypeStruct(rows, "float32", sharding=batch_sharding)
    step_fn = make_train_step(graphdef, optimizer, schedule, grad_accum=config.train.grad_accum)
    return step_fn, state, batch, state_shardings, batch_sharding


def compile_train_step(config, devices) -> dict:
    """Lower and compile the train step of ``config`` on a mesh over ``devices``; its memory and FLOPs.

    Returns a JSON-able dict: parameters, mesh, per-chip ``argument_bytes``, ``output_bytes``,
    ``temp_bytes``, ``alias_bytes``, ``generated_code_bytes``, ``peak_bytes`` (arguments + outputs +
    temporaries - aliased), ``flops`` (per chip, as XLA counts them: a while loop's body is counted
    once, so a scan over layers or chunks is undercounted), ``model_flops`` (per chip, the FLOPs
    registry's training count: 3 x the forward FLOPs per token x the step's tokens / chips; the number
    to quote), ``mosaic_kernels`` (Pallas TPU
    kernel calls in the lowered program: chunk_gla, Newton-Schulz, splash attention) and the seconds
    lowering and compiling took.
    """
    import jax

    from seqmodels.sharding import make_mesh
    from seqmodels.training.loop import validate
    from seqmodels.training.state import count_params

    mesh = make_mesh(config.mesh, devices)
    validate(config, mesh)
    with jax.set_mesh(mesh):
        step_fn, state, batch, state_shardings, batch_sharding = abstract_train_inputs(config, mesh)
        jitted = jax.jit(step_fn, in_shardings=(state_shardings, batch_sharding),
                         out_shardings=(state_shardings, None), donate_argnums=0)
        start = time.perf_counter()
        lowered = jitted.lower(state, batch)
        lowered_at = time.perf_counter()
        compiled = lowered.compile()
        compiled_at = time.perf_counter()
    mosaic_kernels = lowered.as_text().count("tpu_custom_call")
    return _report(config, mesh, count_params(state["params"]), compiled, mosaic_kernels=mosaic_kernels,
                   lower_seconds=lowered_at - start, compile_seconds=compiled_at - lowered_at)


def _report(config, mesh, num_params: int, compiled, *, mosaic_kernels: int, lower_seconds: float,
            compile_seconds: float) -> dict:
    from seqmodels.models import flops_per_token
    from seqmodels.training.flops import training_flops

    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    sizes = {name: int(getattr(memory, f"{name}_size_in_bytes")) for name in
             ("argument", "output", "temp", "alias", "generated_code")}
    return {
        "device_kind": mesh.devices.flat[0].device_kind, "num_devices": int(mesh.size),
        "mesh": {k: int(v) for k, v in mesh.shape.items()}, "num_params": num_params,
        "mixers": list(config.model.mixers), "d_model": config.model.d_model,
        "batch_size": config.train.batch_size, "seq_len": config.data.seq_len,
        "compute_dtype": config.model.compute_dtype, "remat": config.model.remat,
        "optimizer": config.optim.name,
        **{f"{name}_bytes": size for name, size in sizes.items()},
        "peak_bytes": sizes["argument"] + sizes["output"] + sizes["temp"] - sizes["alias"],
        "flops": float(cost.get("flops", 0.0)) if cost else 0.0,
        "model_flops": training_flops(flops_per_token(config.model, config.data.seq_len),
                                      config.train.batch_size * config.data.seq_len) / mesh.size,
        "mosaic_kernels": mosaic_kernels,
        "lower_seconds": round(lower_seconds, 2), "compile_seconds": round(compile_seconds, 2),
    }


def format_report(report: dict) -> str:
    gib = 2.0 ** 30
    return "\n".join([
        f"{report['device_kind']} x {report['num_devices']}, mesh {report['mesh']}; "
        f"{report['num_params'] / 1e6:.1f}M parameters, batch {report['batch_size']} x {report['seq_len']}",
        f"per chip: arguments {report['argument_bytes'] / gib:.3f} GiB, outputs {report['output_bytes'] / gib:.3f} GiB, "
        f"temporaries {report['temp_bytes'] / gib:.3f} GiB, aliased {report['alias_bytes'] / gib:.3f} GiB, "
        f"peak {report['peak_bytes'] / gib:.3f} GiB",
        f"per chip: {report['model_flops']:.4g} FLOPs per step (the FLOPs registry; XLA counts "
        f"{report['flops']:.4g}, a loop body once); {report['mosaic_kernels']} Pallas "
        "(Mosaic) kernel calls; "
        f"lowered in {report['lower_seconds']} s, compiled in {report['compile_seconds']} s",
    ])


REPLY_PREFIX = "aot-reply "


def compile_request(topology: str, config_path: str | None, overrides: list[str], devices: dict | None = None) -> dict:
    """The report of one compile (``topology``, config file, overrides), as ``main`` writes it.

    ``devices``: a cache of each topology's abstract devices, kept across requests. Raises
    ``ConfigError`` or ``ValueError`` for a bad config, override or topology.
    """
    from seqmodels.config_io import load_config

    if not isinstance(topology, str) or not topology:
        raise ValueError(f"topology must be a non-empty string such as v5e:2x4, got {topology!r}")
    if config_path is not None and not isinstance(config_path, str):
        raise ValueError(f"config must be a path string or null, got {config_path!r}")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(f"overrides must be a list of key=value strings, got {overrides!r}")
    config = load_config(config_path, overrides)
    devices = {} if devices is None else devices
    if topology not in devices:
        devices[topology] = topology_devices(topology)
    report = compile_train_step(config, devices[topology])
    return {"topology": topology, "config": config_path, "overrides": list(overrides), **report}


def serve(requests=None, replies=None) -> int:
    """Compile one request per line of ``requests`` (stdin), each a JSON object ``{"topology": ...,
    "config": path or null, "overrides": [...]}``; answer each with one line on ``replies`` (stdout):
    ``aot-reply `` and a JSON object, ``{"report": {...}}`` or ``{"error": "..."}`` for a refused request.

    One process serves every request, so Python, JAX and libtpu start once and each topology's devices
    are described once; a test suite compiles all its cases through it. Ends at the end of the input.
    """
    from seqmodels.config import ConfigError

    requests = sys.stdin if requests is None else requests
    replies = sys.stdout if replies is None else replies
    devices: dict = {}
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict) or not set(request) <= {"topology", "config", "overrides"}:
                raise ValueError(f"a request is a JSON object of topology, config and overrides, got {line.strip()!r}")
            reply = {"report": compile_request(request.get("topology"), request.get("config"),
                                               request.get("overrides", []), devices)}
        except (ConfigError, ValueError) as error:  # json.JSONDecodeError is a ValueError
            reply = {"error": str(error)}
        except Exception as error:  # noqa: BLE001  (a compiler failure answers this request, not the next ones)
            reply = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        replies.write(REPLY_PREFIX + json.dumps(reply) + "\n")
        replies.flush()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", help=TOPOLOGY_HELP + " (required unless --serve)")
    parser.add_argument("--config", help="YAML file stating what differs from the defaults")
    parser.add_argument("--json", help="also write the report as JSON to this file")
    parser.add_argument("--serve", action="store_true",
                        help="read compile requests as JSON lines on stdin, answer each on stdout (see serve)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.remat=full train.batch_size=16")
    args = parser.parse_args(argv)
    if args.serve:
        if args.topology or args.config or args.json or args.overrides:
            parser.error("--serve takes its topology, config and overrides from each request, not the command line")
        return serve()
    if not args.topology:
        parser.error("the following arguments are required: --topology")
    from seqmodels.config import ConfigError
    try:
        report = compile_request(args.topology, args.config, list(args.overrides))
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
