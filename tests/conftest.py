"""Test-wide set-up: 8 simulated CPU devices for the sharding tests (must precede importing jax)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
