"""The pieces every configuration section is made of: the error type, described fields, checks,
and the value types several sections share."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import field
from typing import Literal

# pallas_kernels implementations (pallas_kernels._common.IMPLS): model.kernel_impl, optim.muon_impl.
KernelImpl = Literal["auto", "reference", "xla", "pallas", "pallas_triton", "pallas_tpu"]
# Newton-Schulz polynomial schedules (pallas_kernels.newton_schulz): model.atlas, model.muonssm.
NsCoefficients = Literal["muon", "polar_express"]


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names the key and what was expected."""


def describe(text: str, default=dataclasses.MISSING, factory=dataclasses.MISSING):
    """A dataclass field with a one-line description, shown by ``python train.py --help-config``."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


def is_chunk_size(value: int) -> bool:
    """A chunk length of the chunked kernels: a power of two >= 16."""
    return value >= 16 and value & (value - 1) == 0


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _require_at_least(section, prefix: str, **lows) -> None:
    """``{prefix}.{key}: must be >= {low}, got {value}`` for the first field of ``section`` below its bound."""
    for key, low in lows.items():
        value = getattr(section, key)
        _require(value >= low, f"{prefix}.{key}", f"must be >= {low}, got {value}")


def _require_at_most(section, prefix: str, **highs) -> None:
    """``{prefix}.{key}: must be <= {high}, got {value}`` for the first field of ``section`` above its bound."""
    for key, high in highs.items():
        value = getattr(section, key)
        _require(value <= high, f"{prefix}.{key}", f"must be <= {high:,}, got {value:,}")


# Upper bounds of sizes, far above any model or run this code can build on one pod: a value past them is a typo
# (an extra digit, 10**20), refused here rather than as an allocation failure or overflow when the model is built.
MAX_WIDTH = 2**17  # d_model, head widths (the widest published models use 2**14 - 2**15)
MAX_FF = 2**20  # SwiGLU hidden width
MAX_VOCAB = 2**24  # vocabulary entries (the largest tokenizers have ~2**18)
MAX_TOKENS = 2**27  # positions of a row (max_seq_len, seq_len): 134M tokens
MAX_STEPS = 2**31 - 1  # the train state's step counter is a 32-bit integer
MAX_BATCH = 2**24  # rows of a global batch
MAX_SEED = 2**32 - 1  # jax.random.key keeps the low 32 bits of a seed: larger seeds would repeat smaller ones


def literal_choices(annotation) -> tuple | None:
    """The allowed values of a ``Literal[...]`` annotation, or None for any other annotation."""
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else None


def is_choice(value, choices: tuple) -> bool:
    """``value`` is one of ``choices``, of the same type (so ``True`` is not the choice ``1``)."""
    return any(type(value) is type(choice) and value == choice for choice in choices)


def choice_error(key: str, value, choices: tuple) -> ConfigError:
    """``{key}: must be a, b or c, got 'd'``."""
    names = [str(choice) for choice in choices]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return ConfigError(f"{key}: must be {listed}, got {value!r}")


@functools.cache
def _choice_fields(cls) -> tuple[tuple[str, tuple], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, choices) for f in dataclasses.fields(cls)
                 if (choices := literal_choices(hints[f.name])) is not None)


def _require_choices(section, prefix: str) -> None:
    """Every ``Literal[...]`` field of ``section`` holds one of its values (the type is the check)."""
    for name, choices in _choice_fields(type(section)):
        value = getattr(section, name)
        if not is_choice(value, choices):
            raise choice_error(f"{prefix}.{name}", value, choices)
