"""The pieces every configuration section is made of: the error type, described fields, checks."""

from __future__ import annotations

import dataclasses
from dataclasses import field


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names the key and what was expected."""


def describe(text: str, default=dataclasses.MISSING, factory=dataclasses.MISSING):
    """A dataclass field with a one-line description, shown by ``python train.py --help-config``."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _require_at_least(section, prefix: str, **lows) -> None:
    """``{prefix}.{key}: must be >= {low}, got {value}`` for the first field of ``section`` below its bound."""
    for key, low in lows.items():
        value = getattr(section, key)
        _require(value >= low, f"{prefix}.{key}", f"must be >= {low}, got {value}")
