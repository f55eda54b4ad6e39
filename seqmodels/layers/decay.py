"""Input-dependent per-head decays of recurrent mixers (Mamba2, Gated DeltaNet) and their initialisation.

    Delta_t     = softplus(dt_t + dt_bias)          [.., H]   step size (> 0)
    A           = -exp(A_log)                       [H]       (< 0)
    log_decay_t = Delta_t * A                       [.., H]   (<= 0: the state decays by exp(Delta_t A))

``dt_bias`` starts at softplus^{-1}(Delta_0) with Delta_0 log-uniform in ``[dt_min, dt_max]`` (step
sizes spanning two decades at the defaults 1e-3..1e-1); ``A_log`` starts at log(a), a uniform in
``[1, 16]``. At initialisation the per-token decays exp(Delta A) therefore lie in about [0.2, 1).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def dt_bias_init(key: jax.Array, heads: int, dt_min: float, dt_max: float) -> jax.Array:
    """``softplus^{-1}(Delta_0)`` with ``Delta_0`` log-uniform in ``[dt_min, dt_max]``: float32 ``[H]``."""
    unit = jax.random.uniform(key, (heads,), jnp.float32)
    delta = jnp.exp(unit * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return delta + jnp.log(-jnp.expm1(-delta))  # inverse of softplus


def a_log_init(key: jax.Array, heads: int, low: float = 1.0, high: float = 16.0) -> jax.Array:
    """``log(a)`` with ``a`` uniform in ``[low, high]``: float32 ``[H]``."""
    return jnp.log(jax.random.uniform(key, (heads,), jnp.float32, low, high))


def step_and_log_decay(dt: jax.Array, dt_bias: jax.Array, a_log: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(Delta, log_decay)``, both float32 ``[.., H]``, from the raw projection ``dt: [.., H]``."""
    delta = jax.nn.softplus(dt.astype(jnp.float32) + dt_bias)
    return delta, -jnp.exp(a_log) * delta
