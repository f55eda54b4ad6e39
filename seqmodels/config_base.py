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
