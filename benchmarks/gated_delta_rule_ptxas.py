"""Offline GPU build check of the gated delta rule kernels, on a machine without a GPU.

1. Lowers forward + backward of the Pallas impl for CUDA against an abstract H200
   (``jax.sharding.AbstractDevice``), capturing each kernel's Triton module (TTIR).
2. If a standalone Triton wheel is importable (``--triton-site``, e.g. made by
   ``python -m pip install --target scratch/triton-site triton``), compiles every module to PTX and
   cubin for sm_90a with each kernel's ``(num_warps, num_stages)`` and prints what ptxas reports
   (registers, spills, shared memory) and whether the matmuls became wgmma instructions.

The wheel's Triton is not the one inside jaxlib, so this is evidence, not proof, that the
kernels build on the GPU; its numbers guide ``_specs.LAUNCH``.

    python benchmarks/gated_delta_rule_ptxas.py --triton-site scratch/triton-site
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
from jax._src.pallas.triton import pallas_call_registration

from pallas_kernels.gated_delta_rule._specs import launch_settings
from pallas_kernels.gated_delta_rule.triton import gated_delta_rule_pallas


def triton_modules(shape, chunk_size, dtype=jnp.bfloat16):
    """``[(kernel name, TTIR text)]`` of the forward and backward kernels for an H200."""
    captured = []
    lower = pallas_call_registration.lowering.lower_jaxpr_to_triton_module

    def capture(jaxpr, *args, **kwargs):
        result = lower(jaxpr, *args, **kwargs)
        asm = result.module.operation.get_asm(enable_debug_info=False)
        captured.append((jaxpr.debug_info.func_name, asm))
        return result

    batch, length, heads, key_dim, value_dim = shape
    struct = lambda *dims: jax.ShapeDtypeStruct(dims, dtype)
    args = (struct(batch, length, heads, key_dim), struct(batch, length, heads, key_dim))
    args += (struct(batch, length, heads, value_dim), struct(batch, length, heads))
    args += (struct(batch, length, heads),)

    def loss(q, k, v, beta, log_decay):
        o, state = gated_delta_rule_pallas(
            q, k, v, beta, log_decay, scale=key_dim**-0.5, chunk_size=chunk_size
        )
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(state)

    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    mesh = jax.sharding.AbstractMesh(
        (1,), ("x",), (jax.sharding.AxisType.Auto,), abstract_device=device
    )
    pallas_call_registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            traced = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))).trace(*args)
            traced.lower(lowering_platforms=("cuda",))
    finally:
        pallas_call_registration.lowering.lower_jaxpr_to_triton_module = lower
    return captured


def compile_report(name, ttir, workdir, dtype):
    """Compile one module with the standalone Triton for sm_90a; one line of ptxas facts."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernel = name.removeprefix("gated_delta_rule_")
    num_warps, num_stages = launch_settings(kernel, dtype)
    path = os.path.join(workdir, f"{name}_{abs(hash(ttir))}.ttir")
    with open(path, "w") as f:
        f.write(ttir)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    compiled = triton.compile(path, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = path.replace(".ttir", ".ptx")
    with open(ptx, "w") as f:
        f.write(compiled.asm["ptx"])
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = next(
        os.path.join(bin_dir, n) for n in ("ptxas-blackwell", "ptxas")
        if os.path.exists(os.path.join(bin_dir, n))
    )
    report = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.devnull], capture_output=True, text=True
    ).stderr
    facts = re.findall(r"Used \d+ registers|\d+ bytes spill stores|\d+ bytes spill loads", report)
    wgmma = compiled.asm["ptx"].count("wgmma.mma_async")
    return (
        f"{kernel:16s} warps={num_warps} stages={num_stages} shared={compiled.metadata.shared} B "
        f"wgmma={wgmma} | {', '.join(facts) or report.strip()[:300]}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triton-site", help="folder holding a standalone triton package")
    parser.add_argument("--shape", default="8,4096,16,128,128", help="B,T,H,K,V")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    modules = triton_modules(shape, args.chunk_size, jnp.dtype(args.dtype))
    print(f"lowered {len(modules)} Triton modules for an H200: {[n for n, _ in modules]}")
    if args.triton_site is None:
        return
    sys.path.insert(0, args.triton_site)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory() as workdir:
        for name, ttir in modules:
            print(compile_report(name, ttir, workdir, args.dtype), flush=True)


if __name__ == "__main__":
    main()
