"""Newton–Schulz orthogonalisation: an approximate polar factor U V^T of x = U S V^T.

For each matrix x [M, N] over the last two axes (batched over any leading axes), on the wide
orientation (transposed when M > N):

    X_0 = x / (norm_scale ||x||_F + eps)            (X_0 = 0 when x = 0)
    X_{t+1} = a_t X_t + (b_t A_t + c_t A_t A_t) X_t,   A_t = X_t X_t^T,   t < steps

so every singular value s of X_0 goes through the odd quintics p_t(s) = a_t s + b_t s^3 + c_t s^5
while the singular vectors stay. ``coefficients`` picks (a_t, b_t, c_t) and ``norm_scale``: see
``coefficients.py`` ("muon": (3.4445, -4.7750, 2.0315) every step, norm_scale 1; "polar_express":
the Polar Express schedule with its 1.01 safety scaling; or explicit triples, norm_scale 1).

Implementations (``impl``): ``reference`` (lax.scan per matrix, fp32), ``xla`` (batched matmuls),
``pallas`` (the target platform's fused kernel: ``pallas_triton``, one Triton kernel for matrices
up to 256 on a side, see triton.py; ``pallas_tpu``, one Mosaic kernel up to 512 on a side, see
tpu.py; the XLA path beyond), ``auto`` (the platform's kernel on GPU and TPU, xla on CPU). fp32 inputs compute in fp32; bf16 inputs run the matmuls
of ``xla`` and ``pallas`` on bf16 operands with fp32 accumulation (X carried in fp32).

Gradient: ``xla`` has its own backward (``xla.py``: four matmuls a step, on the same operand
policy as the forward, so a bf16 input's backward runs bf16 matmuls with fp32 accumulation and an
fp32 input's equals autodiff of the reference iteration up to rounding); ``pallas`` is wrapped in a
custom_vjp whose backward recomputes the iteration with the ``xla`` path at the input's dtype and
pulls the cotangent through that backward; ``reference`` is differentiated by JAX. At x = 0 the
output is 0 and the gradient is 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels import _common
from pallas_kernels.newton_schulz import reference, tpu, triton, xla
from pallas_kernels.newton_schulz.coefficients import resolve_coefficients

_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# The fused kernels by Pallas family (``_common.resolve_impl``).
KERNELS = {"pallas_triton": triton, "pallas_tpu": tpu}


def newton_schulz(
    x: jax.Array,
    *,
    steps: int = 5,
    coefficients="muon",
    eps: float = 1e-7,
    impl: str = "auto",
    partition_spec: PartitionSpec | None = None,
) -> jax.Array:
    """Approximate polar factor of each matrix in ``x`` [..., M, N]; same shape and dtype.

    ``partition_spec`` is the PartitionSpec of the leading (batch) axes; when given and a mesh is
    set (``jax.set_mesh``), each device orthogonalises its local block of matrices (the last two
    axes must not be sharded). On a mesh of Explicit axes, x is first resharded to that spec.
    """
    _check_input(x)
    schedule, norm_scale = resolve_coefficients(coefficients, steps)
    if not isinstance(eps, (int, float)) or not eps >= 0 or eps == float("inf"):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    impl = _resolve(impl)
    spec = _full_spec(partition_spec, x.ndim)
    if x.size == 0:
        return x
    fn = functools.partial(_dispatch, impl=impl, schedule=schedule, norm_scale=norm_scale, eps=float(eps))
    if spec is not None:
        fn = _common.shard_local(fn, in_specs=(spec,), out_specs=spec)
        mesh = jax.sharding.get_abstract_mesh()
        if not mesh.empty and all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
            x = jax.sharding.reshard(x, spec)
    return fn(x)


def _check_input(x) -> None:
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) < 2:
        raise ValueError(f"x must have shape [..., M, N] (rank >= 2), got shape {shape}")
    _common.check_float("x", x)
    if jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in _DTYPES]:
        raise ValueError(f"x must be float32, bfloat16 or float16, got dtype {x.dtype}")
    if shape[-2] == 0 or shape[-1] == 0:
        raise ValueError(f"x must have non-empty matrices [..., M >= 1, N >= 1], got shape {shape}")


def _resolve(impl: str) -> str:
    return _common.resolve_impl(impl, KERNELS)


def _full_spec(partition_spec, ndim: int) -> PartitionSpec | None:
    """The spec of all axes of x from the spec of its batch axes; the matrix axes must be None."""
    if partition_spec is None:
        return None
    if not isinstance(partition_spec, PartitionSpec):
        raise ValueError(f"partition_spec must be a jax.sharding.PartitionSpec, got {partition_spec!r}")
    entries = tuple(partition_spec) + (None,) * (ndim - len(partition_spec))
    if len(entries) != ndim or any(e is not None for e in entries[-2:]):
        raise ValueError(
            f"partition_spec must shard only the {ndim - 2} leading (batch) axes of x with rank {ndim}, "
            f"leaving the matrix axes [M, N] unsharded; got {partition_spec}"
        )
    return PartitionSpec(*entries)


@functools.partial(jax.jit, static_argnames=("impl", "schedule", "norm_scale", "eps"))
def _dispatch(x, *, impl, schedule, norm_scale, eps):
    if impl == "reference":
        return reference.newton_schulz(x, schedule, norm_scale, eps)
    if impl == "xla" or not KERNELS[impl].fits_on_chip(*x.shape[-2:]):
        return xla.newton_schulz(x, schedule, norm_scale, eps)
    return _fused(x, schedule, norm_scale, eps, impl)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _fused(x, schedule, norm_scale, eps, impl):
    return KERNELS[impl].newton_schulz(x, schedule, norm_scale, eps)


def _fused_forward(x, schedule, norm_scale, eps, impl):
    return KERNELS[impl].newton_schulz(x, schedule, norm_scale, eps), x


def _fused_backward(schedule, norm_scale, eps, impl, x, cotangent):
    """Recompute the iteration with the XLA path at x's operand policy and pull the cotangent through it."""
    _, pullback = jax.vjp(lambda m: xla.newton_schulz(m, schedule, norm_scale, eps), x)
    (grad,) = pullback(cotangent.astype(x.dtype))
    return (grad.astype(x.dtype),)


_fused.defvjp(_fused_forward, _fused_backward)

__all__ = ["newton_schulz"]
