"""Model FLOPs utilisation: achieved training FLOP/s over the devices' peak.

Training FLOPs per token are ``3 x`` the forward FLOPs of ``model.flops_per_token(seq_len)`` (the
backward pass costs twice the forward); see ``seqmodels.mixers.registry`` for the per-mixer
formulas. The peak per device comes from ``log.peak_flops_per_device`` if set, else from the
table below (dense bf16 / fp32 matrix rates from vendor datasheets), else, on CPU, from a
measured float32 matmul rate, so CPU MFU reads as a share of what this CPU's matmul reaches.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

# device_kind substring -> (bf16 peak, fp32 peak) FLOP/s per device; the first match wins, so a
# name that contains another comes before it. jax names v5e "TPU v5 lite", v5p "TPU v5" (or "TPU v5p")
# and v6e "TPU v6 lite".
PEAK_FLOPS = {
    "H200": (989e12, 67e12),
    "H100": (989e12, 67e12),
    "A100": (312e12, 19.5e12),
    "TPU v6": (918e12, 918e12 / 4),
    "TPU v5 lite": (197e12, 197e12 / 4),
    "TPU v5e": (197e12, 197e12 / 4),
    "TPU v5": (459e12, 459e12 / 4),
    "TPU v4": (275e12, 275e12 / 4),
}


def measured_matmul_flops(size: int = 512, repeats: int = 5) -> float:
    """FLOP/s of a float32 ``size^3`` matmul on the default device (best of ``repeats``)."""
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def peak_flops_per_device(override: float, compute_dtype: str) -> float:
    if override > 0:
        return override
    return peak_for_kind(jax.devices()[0].device_kind, compute_dtype) or measured_matmul_flops()


def peak_for_kind(kind: str, compute_dtype: str) -> float | None:
    """The datasheet peak of the device named ``kind`` (``PEAK_FLOPS``), or None for an unlisted device."""
    for name, (bf16, fp32) in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return bf16 if compute_dtype == "bfloat16" else fp32
    return None


def training_flops(forward_flops_per_token: float, tokens: float) -> float:
    """Training FLOPs of ``tokens`` tokens: 3 x the forward (the backward costs twice the forward)."""
    return 3.0 * forward_flops_per_token * tokens


def mfu(tokens_per_second: float, forward_flops_per_token: float, peak_per_device: float,
        num_devices: int) -> float:
    return training_flops(forward_flops_per_token, tokens_per_second) / (peak_per_device * num_devices)
