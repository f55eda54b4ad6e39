"""Reading and writing configurations: YAML files, dotted overrides, strict type checks.

``load_config("configs/x.yaml", ["train.steps=20", "model.mixers=[swa, attention] * 4"])`` starts
from the dataclass defaults, applies the YAML (which states only what differs), then the overrides.
An unknown key, a key given twice, or a value of the wrong type raises ``ConfigError`` naming the
key and, for unknown keys, the nearest valid ones; a ``Literal[...]`` field refuses a value outside
its type's choices, listing them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
from pathlib import Path

import yaml

from seqmodels.config import Config, ConfigError, ModelConfig
from seqmodels.config_base import choice_error, is_choice, literal_choices
from seqmodels.errors import writing


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping key given twice."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"key {key!r} is given twice (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def all_keys(cls=Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, sections included (``model``, ``model.d_model``, ...)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        keys.append(key)
        if dataclasses.is_dataclass(hints[f.name]):
            keys.extend(all_keys(hints[f.name], key + "."))
    return keys


def _unknown_key(key: str) -> ConfigError:
    near = difflib.get_close_matches(key, all_keys(), n=3, cutoff=0.5)
    hint = f"; nearest valid keys: {', '.join(near)}" if near else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_MIXER_TERM = re.compile(r"^\s*\[([^\[\]]*)\]\s*(?:\*\s*(\d+))?\s*$")


def parse_mixers(value) -> tuple[str, ...]:
    """A mixer list from a YAML list or an expression: ``'[swa, attention] * 4 + [atlas]'``."""
    if isinstance(value, (list, tuple)):
        names = tuple(value)
    elif isinstance(value, str):
        names = ()
        for term in value.split("+"):
            match = _MIXER_TERM.match(term)
            if not match:
                raise ConfigError(f"model.mixers: cannot parse {term.strip()!r} in {value!r}; "
                                  "write a list or terms like '[swa, attention] * 4' joined by '+'")
            items = tuple(s.strip() for s in match.group(1).split(",") if s.strip())
            names += items * int(match.group(2) or 1)
    else:
        raise ConfigError(f"model.mixers: expected a list of mixer names, got {value!r}")
    if not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"model.mixers: every entry must be a mixer name, got {value!r}")
    return names


def _finite(key: str, value) -> float:
    """Every float setting is a finite number: an infinity or NaN (YAML ``.inf`` / ``.nan``), or an integer
    too large for a float, is refused."""
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{key}: must be a finite number, got {value}")
    return number


def _coerce(key: str, annotation, value):
    """Check ``value`` against a field annotation; ints are accepted for floats."""
    origin = typing.get_origin(annotation)
    if key == "model.mixers":
        return parse_mixers(value)
    choices = literal_choices(annotation)
    if choices is not None:
        if not is_choice(value, choices):
            raise choice_error(key, value, choices)
        return value
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(key, option, value)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} matches none of {annotation}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        item_type = typing.get_args(annotation)[0]
        return tuple(_coerce(f"{key}[{i}]", item_type, v) for i, v in enumerate(value))
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(key, value)
    if annotation is float and isinstance(value, str) and _FLOAT.match(value.strip()):
        return _finite(key, value)  # YAML 1.1 reads '1e-3' (no dot) as a string
    if annotation is int and type(value) is int and not -2**63 <= value < 2**63:
        raise ConfigError(f"{key}: {value} does not fit in a 64-bit integer; no setting is that large")
    if annotation in (int, str, bool) and type(value) is annotation:
        return value
    raise ConfigError(f"{key}: expected {getattr(annotation, '__name__', annotation)}, "
                      f"got {value!r} ({type(value).__name__})")


def _build(cls, values: dict, prefix: str):
    """Instantiate dataclass ``cls`` from defaults updated by the nested dict ``values``."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            raise _unknown_key(prefix + str(key))
    kwargs = {}
    for name in names & set(values):
        annotation, key = hints[name], prefix + name
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = _build(annotation, values[name], key + ".")
        else:
            kwargs[name] = _coerce(key, annotation, values[name])
    return cls(**kwargs)


def _set_dotted(tree: dict, key: str, value) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides) -> dict:
    """``["a.b=1", "c=x"]`` -> nested dict; values are parsed as YAML scalars or lists."""
    tree, seen = {}, set()
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        if key in seen:
            raise ConfigError(f"override {key!r} is given twice")
        seen.add(key)
        if key not in all_keys():
            raise _unknown_key(key)
        value = raw if key == "model.mixers" else yaml.safe_load(raw) if raw.strip() else ""
        _set_dotted(tree, key, value)
    return tree


def _deep_merge(base: dict, update: dict, prefix: str = "") -> dict:
    """``update`` over ``base``; a section of ``update`` never replaces a value of ``base`` silently."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value, f"{prefix}{key}.")
        elif isinstance(value, dict) and key in merged:
            raise ConfigError(f"{prefix}{key}: the config file gives {merged[key]!r} where a section (a mapping of "
                              f"keys) is expected; write it as a mapping, e.g. '{key}: {{...}}'")
        else:
            merged[key] = value
    return merged


def data_repr(data: bytes) -> str:
    return " ".join(f"0x{byte:02x}" for byte in data)


def read_yaml(path) -> dict:
    """Read a config YAML file into a dict, with file-level errors a user can act on."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (byte {error.start}: "
                          f"{data_repr(error.object[error.start:error.start + 4])}); save it as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {error.strerror or error}") from None
    try:
        tree = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {problem}") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, got {type(tree).__name__}")
    return tree


def load_config(path=None, overrides=()) -> Config:
    """Defaults, then the YAML at ``path`` (if any), then dotted ``overrides``."""
    tree = read_yaml(path) if path else {}
    tree = _deep_merge(tree, parse_overrides(overrides))
    return _build(Config, tree, "")


def config_from_dict(tree: dict) -> Config:
    """Rebuild a ``Config`` from ``to_dict`` output (e.g. the copy saved with a checkpoint)."""
    return _build(Config, tree, "")


def model_config_from_dict(tree: dict) -> ModelConfig:
    """A ``ModelConfig`` from the ``model`` section of ``to_dict`` output (e.g. an export's config.json)."""
    return _build(ModelConfig, tree, "model.")


def to_dict(config) -> dict:
    """A plain nested dict (tuples become lists) for YAML/JSON."""
    def plain(value):
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(dataclasses.asdict(config))


def save_config(config, path) -> None:
    """Write the resolved config as YAML (the file ``load_config`` reads back to the same Config)."""
    with writing(path):
        Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def config_json(config) -> str:
    return json.dumps(to_dict(config), sort_keys=True)


def help_text(cls=Config, prefix: str = "") -> str:
    """Every key with its default and description, one per line."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            lines.append(help_text(hints[f.name], key + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            choices = literal_choices(hints[f.name])
            listed = f" (one of: {' | '.join(map(str, choices))})" if choices else ""
            lines.append(f"{key} = {default!r}  # {f.metadata.get('help', '')}{listed}")
    return "\n".join(lines)
