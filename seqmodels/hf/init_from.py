"""``model.init_from: hf:DIR``: the model section comes from a Hugging Face directory, and so do the weights.

``resolve_init_from(config)`` replaces the architecture fields of ``config.model`` with those of
``DIR/config.json`` (``seqmodels.hf.config_map``); a field the user set (in the YAML or an override,
``explicit_model_keys``) to other than the directory's value is a ``ConfigError`` naming both (without
that record: a field that differs from its default and from the directory's value). ``model.max_seq_len`` is the
user's when set (RoPE has no learned positions, so a shorter limit loses nothing). The training loop
then starts from ``init_params`` instead of a random initialisation (a resumed run from its checkpoint).
"""

from __future__ import annotations

import dataclasses

import jax

from seqmodels.config import Config, ConfigError, ModelConfig
from seqmodels.hf.errors import HFFormatError
from seqmodels.hf.load import load_model_config, load_pretrained_params

ARCHITECTURE_FIELDS = ("kind", "vocab_size", "d_model", "num_heads", "mixers", "mlp", "d_ff", "norm_eps",
                       "tie_embeddings", "attention.num_kv_heads", "attention.head_dim", "attention.qkv_bias",
                       "attention.rope_theta", "attention.qk_norm", "attention.conv_kernel", "attention.causal")


def _get(model: ModelConfig, key: str):
    value = model
    for part in key.split("."):
        value = getattr(value, part)
    return value


def init_directory(model: ModelConfig) -> str:
    return model.init_from[len("hf:"):]


def _leaf_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys |= _leaf_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return keys


def explicit_model_keys(path=None, overrides=()) -> set[str]:
    """The ``model`` keys (``d_model``, ``attention.rope_theta``, ...) the YAML at ``path`` or ``overrides`` set."""
    from seqmodels.config_io import parse_overrides, read_yaml
    tree = read_yaml(path) if path else {}
    sections = [tree.get("model") or {}, parse_overrides(overrides).get("model") or {}]
    return set().union(*(_leaf_keys(section) for section in sections if isinstance(section, dict)))


def resolve_init_from(config: Config, explicit_keys: set[str] | None = None) -> Config:
    """``config`` with its model section read from ``model.init_from`` (unchanged when that is empty).

    ``explicit_keys``: the model keys the user set (``explicit_model_keys``); ``None`` counts every
    field that differs from its default as set.
    """
    if not config.model.init_from:
        return config
    directory, user, defaults = init_directory(config.model), config.model, ModelConfig()
    try:
        loaded = load_model_config(directory, base=user)
    except HFFormatError as error:
        raise ConfigError(f"model.init_from: {error}") from None
    for key in ARCHITECTURE_FIELDS:
        mine, theirs = _get(user, key), _get(loaded, key)
        chosen = mine != _get(defaults, key) if explicit_keys is None else key in explicit_keys
        if chosen and mine != theirs:
            raise ConfigError(f"model.{key}={mine!r} conflicts with model.init_from={user.init_from}, whose "
                              f"config.json gives {theirs!r}; drop the override or start from another model")
    if (user.max_seq_len != defaults.max_seq_len if explicit_keys is None else "max_seq_len" in explicit_keys):
        loaded = dataclasses.replace(loaded, max_seq_len=user.max_seq_len)
    try:
        return dataclasses.replace(config, model=loaded)
    except ConfigError as error:
        raise ConfigError(f"with the model of model.init_from={user.init_from}: {error}") from None


def init_params(model: ModelConfig, shardings) -> dict:
    """The parameters of ``model.init_from``, placed with ``shardings`` (the train state's parameter shardings)."""
    directory = init_directory(model)
    expected = load_model_config(directory, base=model)
    if dataclasses.replace(expected, max_seq_len=model.max_seq_len) != model:
        raise ConfigError(f"the model section does not match model.init_from={model.init_from}; resolve it first "
                          "with seqmodels.hf.resolve_init_from (train.py does)")
    try:
        params = load_pretrained_params(directory, model)
    except HFFormatError as error:
        raise ConfigError(f"model.init_from: {error}") from None
    return jax.device_put(params, shardings)
