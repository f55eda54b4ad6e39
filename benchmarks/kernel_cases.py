"""The benchmark cases of every ``pallas_kernels`` op, at the H200 anchor shapes (or ``small`` ones).

A ``Case`` holds one shape of one op: how to make its inputs, the named functions to time (every
impl plus same-run baselines), and what one call must do (tokens, bytes or FLOPs), from which
``benchmarks/kernels.py`` derives rates and ratios.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from pallas_kernels import chunk_gla, gated_delta_rule, linear_scan, newton_schulz


@dataclasses.dataclass(frozen=True)
class Case:
    """One shape of one op: inputs, the functions to time, and what a call must do."""

    op: str
    shape: dict
    dtype: str
    make_inputs: Callable[[], tuple]
    functions: dict[str, Callable]
    tokens: int | None  # tokens per call (sequence ops), None for matrix ops
    bytes_moved: int | None = None  # bytes a call must read + write at least (bandwidth cases)
    bytes_moved_by: dict[str, int] = dataclasses.field(default_factory=dict)  # per-function overrides
    flops: float | None = None  # FLOPs of one forward call (compute cases)
    forward_only: tuple[str, ...] = ()  # functions with no meaningful backward (baselines)


def _random(key, shape, dtype, low=None, high=None):
    if low is None:
        return jax.random.normal(key, shape).astype(dtype)
    return jax.random.uniform(key, shape, minval=low, maxval=high).astype(dtype)


def _linear_scan_cases(small: bool) -> list[Case]:
    batch, steps, channels = (2, 256, 64) if small else (4, 8192, 4096)
    dtype = jnp.float32

    def make_inputs():
        key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
        shape = (batch, steps, channels)
        return _random(key_a, shape, dtype, 0.5, 1.0), _random(key_b, shape, dtype)

    def scan_with(impl):
        return lambda a, b: linear_scan(a, b, impl=impl)

    functions = {
        "copy (x + 1)": lambda a, b: a + 1,
        "xla (associative_scan)": scan_with("xla"),
        "pallas": scan_with("pallas"),
    }
    if small:
        functions["reference (lax.scan)"] = scan_with("reference")
    element_bytes = jnp.dtype(dtype).itemsize
    return [
        Case(
            op="linear_scan",
            shape=dict(B=batch, T=steps, D=channels),
            dtype=jnp.dtype(dtype).name,
            make_inputs=make_inputs,
            functions=functions,
            tokens=batch * steps,
            bytes_moved=3 * batch * steps * channels * element_bytes,  # read a, b; write h
            bytes_moved_by={"copy (x + 1)": 2 * batch * steps * channels * element_bytes},
            forward_only=("copy (x + 1)",),
        )
    ]


def _chunk_gla_cases(small: bool) -> list[Case]:
    batch, steps, heads, key_dim, value_dim = (1, 128, 2, 32, 32) if small else (8, 4096, 16, 128, 128)
    chunk_size = 16 if small else 64
    dtype = jnp.bfloat16
    cases = []
    for vector_decay in (False, True):

        def make_inputs(vector_decay=vector_decay):
            keys = jax.random.split(jax.random.PRNGKey(0), 4)
            decay_shape = (batch, steps, heads) + ((key_dim,) if vector_decay else ())
            return (
                _random(keys[0], (batch, steps, heads, key_dim), dtype),
                _random(keys[1], (batch, steps, heads, key_dim), dtype),
                _random(keys[2], (batch, steps, heads, value_dim), dtype),
                _random(keys[3], decay_shape, jnp.float32, -0.2, -0.001),
            )

        def gla_with(impl):
            return lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=chunk_size, impl=impl)[0]

        functions = {"xla": gla_with("xla"), "pallas": gla_with("pallas")}
        if small:
            functions["reference"] = gla_with("reference")
        # Chunked algorithm per token: q k^T and A v within the chunk, q S and k^T v across chunks.
        flops_per_token = 2 * chunk_size * (key_dim + value_dim) + 4 * key_dim * value_dim
        cases.append(
            Case(
                op="chunk_gla",
                shape=dict(B=batch, T=steps, H=heads, K=key_dim, V=value_dim, chunk=chunk_size,
                           decay="per key channel" if vector_decay else "per head"),
                dtype=jnp.dtype(dtype).name,
                make_inputs=make_inputs,
                functions=functions,
                tokens=batch * steps,
                flops=float(flops_per_token * batch * steps * heads),
            )
        )
    return cases


def _gated_delta_rule_cases(small: bool) -> list[Case]:
    """k L2-normalised, beta in (0, 1), log decay near 0: the usual Gated DeltaNet gates.

    H200 target: forward >= 27M tokens/s (flash-linear-attention: 1.19 ms at B8 T4096 H16 K=V=128),
    forward+backward >= 3x the xla impl measured in the same run.
    """
    batch, steps, heads, key_dim, value_dim = (1, 128, 2, 32, 32) if small else (8, 4096, 16, 128, 128)
    chunk_size = 32 if small else 64
    dtype = jnp.float32 if small else jnp.bfloat16

    def make_inputs():
        keys = jax.random.split(jax.random.PRNGKey(0), 5)
        k = jax.random.normal(keys[1], (batch, steps, heads, key_dim), jnp.float32)
        return (
            _random(keys[0], (batch, steps, heads, key_dim), dtype),
            (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype),
            _random(keys[2], (batch, steps, heads, value_dim), dtype),
            jax.nn.sigmoid(jax.random.normal(keys[3], (batch, steps, heads))).astype(dtype),
            jax.nn.log_sigmoid(4.0 + jax.random.normal(keys[4], (batch, steps, heads))).astype(dtype),
        )

    def rule_with(impl):
        return lambda q, k, v, beta, g: gated_delta_rule(q, k, v, beta, g, chunk_size=chunk_size, impl=impl)[0]

    functions = {"xla": rule_with("xla"), "pallas": rule_with("pallas")}
    return [Case(op="gated_delta_rule",
                 shape=dict(B=batch, T=steps, H=heads, K=key_dim, V=value_dim, chunk=chunk_size),
                 dtype=jnp.dtype(dtype).name, make_inputs=make_inputs, functions=functions,
                 tokens=batch * steps)]


def newton_schulz_flops(shape: tuple[int, ...], steps: int = 5) -> float:
    """Matmul FLOPs of ``steps`` steps on a stack of [..., M, N] matrices: 4 m^2 n + 2 m^3 per step (m <= n)."""
    m, n = sorted(shape[-2:])
    return float(math.prod(shape[:-2]) * steps * (4 * m * m * n + 2 * m**3))


def _newton_schulz_cases(small: bool) -> list[Case]:
    """bf16, 5 "muon" steps. H200 targets: 1024 x 128^2 and 256 x 64^2 >= 4x xla; 4096^2 >= 0.95x xla."""
    shapes = ((4, 32, 32), (2, 16, 48)) if small else ((1024, 128, 128), (256, 64, 64), (64, 1024, 1024),
                                                       (4096, 4096))
    cases = []
    for index, shape in enumerate(shapes):
        def make_inputs(shape=shape, index=index):
            return (jax.random.normal(jax.random.PRNGKey(index), shape, jnp.float32).astype(jnp.bfloat16),)

        functions = {impl: (lambda x, impl=impl: newton_schulz(x, steps=5, impl=impl)) for impl in ("xla", "pallas")}
        cases.append(Case(op="newton_schulz", shape=dict(matrices=list(shape)), dtype="bfloat16",
                          make_inputs=make_inputs, functions=functions, tokens=None,
                          flops=newton_schulz_flops(shape)))
    return cases


# Atlas against Gated DeltaNet: configs/atlas.yaml's memory settings at a one-GPU LM shape (d_model 512,
# 8 heads of 64, 8 rows of 4096 tokens); small: 1 row of 64 tokens, 2 heads of 32.
ATLAS_SHAPE = dict(B=8, T=4096, d_model=512, H=8, dtype="bfloat16")
ATLAS_SMALL_SHAPE = dict(B=1, T=64, d_model=64, H=2, dtype="float32")


def _atlas_config(shape: dict, ns_granularity: str):
    """``configs/atlas.yaml`` at ``shape`` (d_model, heads, compute dtype) with ``ns_granularity``."""
    from pathlib import Path

    from seqmodels.config_io import load_config
    config = Path(__file__).resolve().parents[1] / "configs" / "atlas.yaml"
    return load_config(config, [f"model.d_model={shape['d_model']}", f"model.num_heads={shape['H']}",
                                f"model.max_seq_len={shape['T']}", f"data.seq_len={shape['T']}",
                                f"model.compute_dtype={shape['dtype']}",
                                f"model.atlas.ns_granularity={ns_granularity}"]).model


def _atlas_memory_case(shape: dict, ns_granularity: str, impls: tuple[str, ...]) -> Case:
    """The Atlas memory op as the mixer calls it: unit keys / queries through the polynomial feature map,
    gates drawn in the config's ranges, one document per row, ``M_0`` at the mixer's initial scale."""
    from pallas_kernels.atlas_memory import AtlasInputs, atlas_memory
    from seqmodels.mixers.atlas import atlas_settings, feature_map, initial_coefficients
    model = _atlas_config(shape, ns_granularity)
    settings, atlas = atlas_settings(model), model.atlas
    batch, steps, heads, head_dim = shape["B"], shape["T"], shape["H"], model.head_dim
    coefficients = jnp.broadcast_to(initial_coefficients(atlas.poly_degree), (heads, atlas.poly_degree))
    segment_ids = jnp.ones((batch, steps), jnp.int32)
    ranges = (atlas.alpha_range, atlas.theta_range, atlas.eta_range, atlas.gamma_range)

    def make_inputs():
        keys = jax.random.split(jax.random.PRNGKey(0), 8)
        unit = [x / jnp.linalg.norm(x, axis=-1, keepdims=True)
                for x in (jax.random.normal(key, (batch, steps, heads, head_dim)) for key in keys[:2])]
        phi_k, phi_q = (feature_map(x, coefficients, atlas.poly_key_dim) for x in unit)
        values = jax.random.normal(keys[2], (batch, steps, heads, head_dim))
        gates = tuple(_random(key, (batch, steps, heads), jnp.float32, low, high)
                      for key, (low, high) in zip(keys[3:7], ranges))
        memory = tuple(_random(key, (heads, m, n), jnp.float32) * m**-0.5
                       for key, (m, n) in zip(jax.random.split(keys[7], len(settings.layout.shapes)),
                                              settings.layout.shapes))
        return (phi_k, values, phi_q, *gates, *memory)

    def atlas_with(impl):
        def run(phi_k, values, phi_q, alpha, theta, eta, gamma, *memory):
            inputs = AtlasInputs(phi_k, values, phi_q, alpha, theta, eta, gamma, segment_ids)
            return atlas_memory(inputs, memory, settings, impl=impl)
        return run

    layout = settings.layout
    return Case(op="atlas_memory",
                shape=dict(B=batch, T=steps, H=heads, F=layout.feature_dim, V=layout.value_dim,
                           hidden=layout.hidden_dim, window=settings.window, chunk=settings.chunk_size,
                           ns_steps=settings.ns_steps, ns_granularity=ns_granularity),
                dtype=f"float32 (Newton-Schulz {settings.ns_dtype})", make_inputs=make_inputs,
                functions={impl: atlas_with(impl) for impl in impls}, tokens=batch * steps)


def _atlas_memory_cases(small: bool) -> list[Case]:
    """Gated DeltaNet's op at the Atlas shape, then the Atlas op with ``ns_granularity`` token (``impl`` auto and,
    on the GPU shape, pallas: the fused Triton sweep) and chunk.

    The delta rule is the baseline: the same rows, heads and head dimension (K = V = 64), its
    ``model.deltanet.chunk_size``, in the compute dtype; the Atlas op runs in float32 as in the mixer
    (Newton-Schulz operands in the compute dtype). ``benchmarks/gpu_suite.py`` reports each Atlas
    time over the delta rule's of the same run.
    """
    shape = ATLAS_SMALL_SHAPE if small else ATLAS_SHAPE
    model = _atlas_config(shape, "token")
    batch, steps, heads, head_dim = shape["B"], shape["T"], shape["H"], model.head_dim
    chunk_size, dtype = model.deltanet.chunk_size, jnp.dtype(shape["dtype"])

    def make_inputs():
        keys = jax.random.split(jax.random.PRNGKey(0), 5)
        q, k = (jax.random.normal(key, (batch, steps, heads, head_dim)) for key in keys[:2])
        return (q.astype(dtype), (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype),
                _random(keys[2], (batch, steps, heads, head_dim), dtype),
                jax.nn.sigmoid(jax.random.normal(keys[3], (batch, steps, heads))).astype(dtype),
                jax.nn.log_sigmoid(4.0 + jax.random.normal(keys[4], (batch, steps, heads))).astype(dtype))

    def rule(q, k, v, beta, g):
        return gated_delta_rule(q, k, v, beta, g, chunk_size=chunk_size, impl="auto")[0]

    baseline = Case(op="gated_delta_rule", shape=dict(B=batch, T=steps, H=heads, K=head_dim, V=head_dim,
                                                       chunk=chunk_size),
                    dtype=dtype.name, make_inputs=make_inputs, functions={"auto": rule}, tokens=batch * steps)
    # The paper's rule also as the fused sweep (impl="pallas": the Triton kernel on a GPU), which auto does not pick
    # until this section has timed it; not in the small (CPU) suite, where it would time the Pallas interpreter.
    token_impls = ("auto",) if small else ("auto", "pallas")
    return [baseline, _atlas_memory_case(shape, "token", token_impls), _atlas_memory_case(shape, "chunk", ("auto",))]


# Add an op here: a builder returning its cases.
CASE_BUILDERS: dict[str, Callable[[bool], list[Case]]] = {
    "linear_scan": _linear_scan_cases,
    "chunk_gla": _chunk_gla_cases,
    "gated_delta_rule": _gated_delta_rule_cases,
    "newton_schulz": _newton_schulz_cases,
    "atlas_memory": _atlas_memory_cases,
}
