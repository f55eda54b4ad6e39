"""The mixer registry: name -> how to build it, how many FLOPs it costs and which config sections it
reads; the registered config sections; the ``Mixer`` interface.

A mixer (``Mixer`` below) is an ``nnx.Module`` with ``__call__(x, *, segment_ids=None,
positions=None, cache=None) -> (y, cache)`` over ``x: [B, T, d_model]`` and ``init_cache(batch_size,
max_len, dtype)``. Training calls it on whole sequences (``cache=None``; ``segment_ids [B, T]`` mark
the packed documents, 0 = padding, and ``positions [B, T]`` count within each document); decoding
passes the cache and one or more new tokens. The decoder LM (``models/lm.py``) and the looped
model's shared block (``models/looped.py``) build any registered mixer through this interface.

``flops_per_token(model_config, seq_len)`` is the *forward* matmul FLOPs per token of one layer of
the mixer (2 FLOPs per multiply-add), averaged over the ``seq_len`` positions of a row; each mixer
file documents its formula. Training counts 3x forward (backward = 2x forward). These feed MFU.

Config sections: a mixer's settings are a frozen dataclass defined in its own file and registered
once, by the file that owns it, with ``register_section(name, section, description)``; it becomes the key
``model.<name>`` (``seqmodels.config.ModelConfig`` has one field per registered section). One
section may serve several mixers, and a mixer may read several (``atlas_mag`` reads ``atlas``,
``attention`` and ``swa``): each mixer names the sections it reads when it registers. A section may
define ``check_model(model)``, its checks against the rest of the model section (e.g. Atlas's
``poly_key_dim`` against the head width); ``ModelConfig`` calls it when a layer reads the section.
Every module of ``seqmodels.mixers`` is imported by the package, so a new file registers itself.

Context parallelism: a mixer registered with ``context_parallel=True`` runs with a row's tokens split
over the ``context`` mesh axis (``seqmodels.layers.context``: short-convolution halos, state passing
for linear recurrences, the Atlas memory's shards in sequence); ``check_context_parallel`` refuses
``mesh.context > 1`` for the others. A mixer whose split form costs more than its share registers a
``context_note`` (a template of ``{context}``), which ``context_parallel_notes`` gives the training run to log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import jax
from flax import nnx

from seqmodels.config_base import ConfigError
from seqmodels.config_model import ModelConfigBase


@runtime_checkable
class Mixer(Protocol):
    """What every registered mixer offers (module docstring)."""

    def __call__(self, x: jax.Array, *, segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
                 cache: Any = None) -> tuple[jax.Array, Any]:
        """``y [B, T, d_model]`` and the updated cache (None when ``cache`` is None)."""

    def init_cache(self, batch_size: int, max_len: int, dtype=...) -> Any:
        """The empty decoding cache for ``batch_size`` rows of up to ``max_len`` tokens."""


@dataclass(frozen=True)
class MixerEntry:
    build: Callable[[ModelConfigBase, nnx.Rngs], Mixer]
    flops_per_token: Callable[[ModelConfigBase, int], float]
    sections: tuple[str, ...]  # the model.<section> keys the mixer reads
    context_parallel: bool = False  # runs with the sequence split over mesh.context (module docstring)
    context_note: str = ""  # what the split costs, a template of {context} (module docstring); "" = its share


@dataclass(frozen=True)
class SectionEntry:
    section: type  # a frozen dataclass: the keys of model.<name>
    description: str  # one line: what the section holds, in the schema


MIXERS: dict[str, MixerEntry] = {}
SECTIONS: dict[str, SectionEntry] = {}


def register(name: str, build, flops_per_token, *, sections: Iterable[str], context_parallel: bool = False,
             context_note: str = "") -> None:
    """Register mixer ``name``, reading the config sections ``sections`` (checked by ``registered_sections``);
    ``context_parallel``: it runs with the sequence split over ``mesh.context``, at the cost ``context_note``
    states (``"{context}"`` stands for ``mesh.context``) when that is more than its share."""
    if name in MIXERS:
        raise ValueError(f"mixer {name!r} is registered twice")
    sections = tuple(sections)
    if not sections or not all(isinstance(section, str) and section for section in sections):
        raise ValueError(f"mixer {name!r}: sections must name at least one config section (model.<section>), "
                         f"got {sections!r}")
    if context_note and not context_parallel:
        raise ValueError(f"mixer {name!r}: a context_note describes a context-parallel form; none is registered")
    MIXERS[name] = MixerEntry(build, flops_per_token, sections, bool(context_parallel), context_note)


def register_section(name: str, section: type, description: str) -> None:
    """Register ``section`` (a frozen dataclass) as the config section ``model.<name>``, described by
    ``description``."""
    if name in SECTIONS:
        raise ValueError(f"config section model.{name} is registered twice (by "
                         f"{SECTIONS[name].section.__module__} and {section.__module__}); one file owns a section")
    if not name.isidentifier():
        raise ValueError(f"config section name {name!r} must be a Python identifier (it is a field of ModelConfig)")
    if not (dataclasses.is_dataclass(section) and isinstance(section, type)
            and section.__dataclass_params__.frozen):
        raise TypeError(f"config section model.{name}: {section!r} must be a frozen dataclass")
    SECTIONS[name] = SectionEntry(section, description)


def registered_sections() -> dict[str, SectionEntry]:
    """Every registered section, by name, once each mixer's sections are checked to be registered."""
    for mixer, entry in MIXERS.items():
        for section in entry.sections:
            if section not in SECTIONS:
                raise ValueError(f"mixer {mixer!r} reads config section model.{section}, which no module registers "
                                 f"(register_section); registered sections: {', '.join(sorted(SECTIONS))}")
    return dict(sorted(SECTIONS.items()))


def sections_used_by(names: Iterable[str]) -> tuple[str, ...]:
    """The sections the mixers ``names`` read, each once, in order of first use; unknown names are skipped
    (``check_mixer_names`` reports them)."""
    used = {}
    for name in names:
        if name in MIXERS:
            used.update(dict.fromkeys(MIXERS[name].sections))
    return tuple(used)


def _entry(name: str, key: str = "model.mixers") -> MixerEntry:
    if name not in MIXERS:
        raise ConfigError(f"{key}: unknown mixer {name!r}; known mixers: {', '.join(sorted(MIXERS))}")
    return MIXERS[name]


def check_mixer_names(names, key: str = "model.mixers") -> None:
    """Raise ``ConfigError`` naming ``key`` and the first unknown mixer in ``names``."""
    for name in names:
        _entry(name, key)


def context_parallel_mixers() -> tuple[str, ...]:
    """The registered mixers that run with the sequence split over ``mesh.context``."""
    return tuple(sorted(name for name, entry in MIXERS.items() if entry.context_parallel))


def check_context_parallel(names, context: int, key: str = "model.mixers") -> None:
    """Raise ``ConfigError`` when ``context > 1`` and a mixer of ``names`` has no context-parallel form."""
    if context == 1:
        return
    missing = [name for name in dict.fromkeys(names) if not _entry(name, key).context_parallel]
    if missing:
        raise ConfigError(f"mesh.context={context}: {key} has {', '.join(missing)}, which cannot yet run with the "
                          f"sequence split over devices; context-parallel mixers: "
                          f"{', '.join(context_parallel_mixers())}. Use mesh.context=1 for this model")


def context_parallel_notes(names, context: int) -> list[str]:
    """One line per distinct ``context_note`` of the mixers ``names`` at ``mesh.context = context`` (none at 1),
    naming the mixers it concerns: what their split form costs beyond their share."""
    if context == 1:
        return []
    by_note: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        note = _entry(name).context_note
        if note:
            by_note.setdefault(note.format(context=context), []).append(name)
    return [f"{', '.join(mixers)}: mesh.context={context} {note}" for note, mixers in by_note.items()]


def build_mixer(name: str, config: ModelConfigBase, rngs: nnx.Rngs) -> Mixer:
    return _entry(name).build(config, rngs)


def mixer_flops_per_token(name: str, config: ModelConfigBase, seq_len: int) -> float:
    return float(_entry(name).flops_per_token(config, seq_len))
