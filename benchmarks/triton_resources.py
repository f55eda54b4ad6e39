"""Compile the Pallas Triton kernels for an H200 without a GPU and report their resources.

    python benchmarks/triton_resources.py --out-dir scratch/ttir            # lower, write Triton IR
    python benchmarks/triton_resources.py --out-dir scratch/ttir --compile  # also compile for sm_90

Step 1 (needs jax only) lowers forward+backward of each op at the H200 anchor shapes for an
abstract CUDA device and writes each kernel's Triton IR (TTIR) as text. Step 2 (needs the
``triton`` package, not a project dependency: install it into a separate directory and point
``--triton-path`` at it) compiles each TTIR to a cubin for sm_90 in a subprocess and reads
registers, spills (ptxas -v) and shared memory per kernel: the numbers that decide whether a
kernel fits an SM (227 KiB shared memory per block on the H200) and how many programs run at once.
The IR is produced by jaxlib's Triton dialect and compiled by the pip Triton, which need not be the
version XLA bundles: evidence that the kernels compile, not proof.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

from pallas_kernels import chunk_gla, linear_scan

H200 = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")


def _grad_cases():
    """(name, function, abstract args): forward+backward of each op at the anchor shapes."""
    cases = []
    for dtype in (jnp.float32, jnp.bfloat16):
        a = jax.ShapeDtypeStruct((4, 8192, 4096), dtype)
        scan_loss = lambda a, b: jnp.sum(linear_scan(a, b, impl="pallas").astype(jnp.float32))  # noqa: E731
        cases.append((f"linear_scan_{jnp.dtype(dtype).name}", jax.grad(scan_loss, (0, 1)), (a, a)))
        for vector_decay in (False, True):
            q = jax.ShapeDtypeStruct((8, 4096, 16, 128), dtype)
            decay = jax.ShapeDtypeStruct((8, 4096, 16) + ((128,) if vector_decay else ()), jnp.float32)
            gla_loss = lambda q, k, v, g: jnp.sum(chunk_gla(q, k, v, g, impl="pallas")[0].astype(jnp.float32))  # noqa: E731
            name = f"chunk_gla_{'vector' if vector_decay else 'scalar'}_{jnp.dtype(dtype).name}"
            cases.append((name, jax.grad(gla_loss, (0, 1, 2, 3)), (q, q, q, decay)))
    return cases


def _triton_calls(stablehlo_module):
    """Yield (kernel name, num_warps, num_stages, TTIR bytecode) of every Triton custom call."""
    from jax._src.lib.mlir import ir

    for op in stablehlo_module.body.operations:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    attrs = inner.operation.attributes
                    if inner.operation.name != "stablehlo.custom_call" or "mhlo.backend_config" not in attrs:
                        continue
                    if ir.StringAttr(attrs["call_target_name"]).value != "__gpu$xla.gpu.triton":
                        continue
                    config = ir.DictAttr(attrs["mhlo.backend_config"])
                    warps = ir.IntegerAttr(config["num_warps"]).value
                    stages = ir.IntegerAttr(config["num_stages"]).value
                    yield ir.StringAttr(config["name"]).value, warps, stages, ir.StringAttr(config["ir"]).value_bytes


def dump(out_dir: Path) -> list[Path]:
    """Lower every case for the abstract H200 and write its kernels' TTIR; returns the paths."""
    from jax._src.pallas.triton import lowering  # private: the context with the Triton dialect

    out_dir.mkdir(parents=True, exist_ok=True)
    mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=H200)
    paths = []
    for name, fn, args in _grad_cases():
        with jax.sharding.use_abstract_mesh(mesh):
            module = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).compiler_ir("stablehlo")
        context = lowering._new_ir_context()
        for index, (kernel, warps, stages, bytecode) in enumerate(_triton_calls(module)):
            with context:
                text = lowering.ir.Module.parse(bytecode).operation.get_asm()
            path = out_dir / f"{name}.{index}.{kernel}.w{warps}.s{stages}.ttir"
            path.write_text(text)
            paths.append(path)
    return paths


def compile_for_sm90(paths: list[str]) -> None:
    """Runs in a subprocess with ``triton`` importable: one JSON line of resources per TTIR file."""
    import triton
    from triton.backends.compiler import GPUTarget

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell"
    for path in paths:
        warps, stages = map(int, re.search(r"\.w(\d+)\.s(\d+)\.ttir$", path).groups())
        options = dict(num_warps=warps, num_stages=stages)
        kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32), options=options)
        ptx = Path(path).with_suffix(".ptx")
        ptx.write_text(kernel.asm["ptx"])
        log = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", str(ptx), "-o", "/dev/null"],
                             capture_output=True, text=True).stderr
        registers = re.search(r"Used (\d+) registers", log)
        spills = re.search(r"(\d+) bytes spill stores", log)
        print(json.dumps(dict(kernel=Path(path).name, num_warps=warps, shared_bytes=kernel.metadata.shared,
                              registers=int(registers.group(1)) if registers else None,
                              spill_store_bytes=int(spills.group(1)) if spills else None)), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="folder for the .ttir/.ptx files")
    parser.add_argument("--compile", action="store_true", help="compile for sm_90 with the triton package")
    parser.add_argument("--triton-path", default="", help="folder to put first on sys.path for triton")
    parser.add_argument("--compile-only", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_only is not None:
        compile_for_sm90(args.compile_only)
        return
    paths = dump(args.out_dir)
    print(f"wrote {len(paths)} kernels to {args.out_dir}")
    if args.compile:
        env_path = [args.triton_path] if args.triton_path else []
        code = f"import sys; sys.path[:0] = {env_path!r}; " \
               f"from benchmarks import triton_resources as t; t.compile_for_sm90(sys.argv[1:])"
        subprocess.run([sys.executable, "-c", code, *map(str, paths)], check=True)


if __name__ == "__main__":
    main()
