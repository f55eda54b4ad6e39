"""The train step with each row's tokens split over every device (``mesh.context = N``) against the same step
with the rows split instead (``mesh.data = N``), on one node of N devices.

Both layouts run the same program on the same global batch: N rows of ``T`` tokens (T = 32768; ``--small``:
128), the ~125M LM of ``benchmarks/train_step.py`` (``--small``: its tiny one), ``kernel_impl=auto``, AdamW.
Each device holds ``T`` tokens either way: one whole row (``data``) or a ``T / N`` slice of every row
(``context``). The context layout pays its collectives (attention's K/V exchange, the recurrences' state
passing, the short convolutions' halos: ``seqmodels.layers.context``) and gains nothing in memory at this
shape; what it buys is rows longer than one device holds. Per layout: median step time, tokens/s, the
compiled step's memory per device (XLA's memory analysis of the partitioned program) and the devices'
peak bytes in use (the process's peak so far, the highest device: the later layout's includes the
earlier's), and the loss after the timed steps, which the two layouts must share (same rows, same
initialisation). The context record carries its tokens/s and compiled bytes over the data layout's.

With one device there is nothing to split: every mixer is reported as skipped, with the reason (the
``train_step`` section is the one-device step). On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
simulates a node.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import train_step as train_bench

MIXERS = ("attention", "gated_deltanet")
SEQ_LEN, SMALL_SEQ_LEN = 32768, 128


def _device_peak_bytes() -> int | None:
    peaks = [(device.memory_stats() or {}).get("peak_bytes_in_use") for device in jax.local_devices()]
    return max((p for p in peaks if p is not None), default=None)


def measure(args, mixer: str, seq_len: int, rows: int, data: int, context: int) -> dict:
    """One timed train step of ``rows`` rows of ``seq_len`` tokens on a ``data x context`` mesh of every device."""
    import optax

    from seqmodels.config import MeshConfig
    from seqmodels.sharding import batch_sharding, make_mesh
    from seqmodels.training.step import make_train_step
    from seqmodels.training.state import init_train_state

    config = train_bench.model_config(args, mixer, "auto", seq_len)
    mesh = make_mesh(MeshConfig(data=data, context=context))
    optimizer = optax.adamw(1e-4)
    with jax.set_mesh(mesh):
        graphdef, state, shardings = init_train_state(config, 0, mesh, optimizer)
        tokens = jax.random.randint(jax.random.key(0), (rows, seq_len + 1), 0, config.vocab_size)
        batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": jnp.ones((rows, seq_len))}
        placement = batch_sharding(mesh)
        batch = {name: jax.device_put(array, placement) for name, array in batch.items()}
        step = jax.jit(make_train_step(graphdef, optimizer, lambda count: 1e-4), in_shardings=(shardings, placement),
                       out_shardings=(shardings, None), donate_argnums=0)
        compiled = step.lower(state, batch).compile()
        seconds, metrics = train_bench.time_steps(compiled, state, batch, args.warmup, args.steps)
    return {"mixer": mixer, "layout": f"context={context}" if context > 1 else f"data={data}",
            "mesh": {"data": data, "context": context}, "seq_len": seq_len, "batch_size": rows,
            "tokens_per_device": rows * seq_len // (data * context), "step_seconds": seconds,
            "tokens_per_second": rows * seq_len / seconds, "compiled_bytes_per_device": train_bench._memory(compiled),
            "device_peak_bytes": _device_peak_bytes(), "loss": float(metrics["loss"])}


def compare(split: dict, whole: dict) -> dict:
    """``split`` with its tokens/s and compiled bytes per device over ``whole``'s (the data layout's)."""
    ratios = {"tokens_per_second_vs_data": split["tokens_per_second"] / whole["tokens_per_second"]}
    if split["compiled_bytes_per_device"] and whole["compiled_bytes_per_device"]:
        ratios["compiled_bytes_vs_data"] = split["compiled_bytes_per_device"] / whole["compiled_bytes_per_device"]
    return {**split, **ratios}


def run(small: bool, mixers: tuple[str, ...] = MIXERS) -> list[dict]:
    """Per mixer, the data layout's record then the context layout's (or one skipped record per mixer)."""
    devices, seq_len = jax.device_count(), SMALL_SEQ_LEN if small else SEQ_LEN
    reason = None
    if devices < 2:
        reason = (f"{devices} device: mesh.context needs >= 2 to split a row (the train_step section is the "
                  f"one-device step)")
    elif seq_len % devices:
        reason = f"T = {seq_len} is not a multiple of the {devices} devices"
    if reason:
        return [{"mixer": mixer, "skipped": reason} for mixer in mixers]
    args = train_bench.parse_args(["--small", "--warmup", "1", "--steps", "1"] if small else [])
    records = []
    for mixer in mixers:
        layouts = []
        for data, context in ((devices, 1), (1, devices)):
            try:
                layouts.append(measure(args, mixer, seq_len, devices, data, context))
            except Exception as error:  # an OOM or a lowering failure is a result too
                layouts.append({"mixer": mixer, "layout": f"context={context}" if context > 1 else f"data={data}",
                                "error": f"{type(error).__name__}: {str(error)[:500]}"})
        whole, split = layouts
        if "error" not in whole and "error" not in split:
            split = compare(split, whole)
        records += [whole, split]
    return records
