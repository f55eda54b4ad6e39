"""Sweep files: what ``ablate.py --sweep FILE`` runs, checked in full before any run starts.

A sweep file (YAML)::

    name: memory                       # runs/sweeps/NAME/, results/sweeps/NAME/ (default: the file's stem)
    base: configs/transformer.yaml     # the config every variant starts from
    overrides: {model.d_model: 128}    # dotted overrides of every variant
    variants:                          # name -> dotted overrides (on top of `overrides`)
      transformer: {model.mixers: "[attention] * 4"}
      mamba2: {config: configs/mamba2.yaml, model.mixers: "[mamba2] * 8"}   # `config` replaces `base`
      atlas: {config: configs/atlas.yaml, seeds: [0], time_limit_minutes: 3}   # this variant's own seeds / limit
    seeds: [0, 1]                      # train.seed = data.seed = each seed
    budget: {tokens: 1000000}          # or {flops: 3.0e13}: training FLOPs, 3 x forward (FLOPs registry)
    time_limit_minutes: 30             # per run; a run stopped by it is reported with its tokens/s (0 = none)
    eval:
      suites: [perplexity, needle]     # perplexity | recall | needle | ruler
      points: 4                        # loss evaluated at this many checkpoints along training
      batch_size: 4
      max_batches: 8
      needle: {length: 512, depths: [0.1, 0.5, 0.9], per_depth: 8}
      ruler: {lengths: [1024, 2048], tasks: [niah_single_1, niah_single_2], depths: [0, 0.5, 1],
              per_depth: 4, seed: 42}     # seqmodels.evaluation.ruler; lengths above model.max_seq_len left out

Budget -> steps: ``tokens_per_step = train.batch_size * data.seq_len``; a token budget ``T`` gives
``steps = max(1, round(T / tokens_per_step))``; a FLOPs budget ``F`` gives ``steps = max(1, round(F /
(3 * flops_per_token * tokens_per_step)))`` with ``flops_per_token`` the forward FLOPs of
``seqmodels.models.flops_per_token(model, seq_len)``, so variants of different cost get equal compute.

``load_sweep`` refuses (``SweepError``, naming the variant and the key) a file with an unknown key, a
variant whose overrides do not load (``config_io.load_config``) or fail the checks training makes
before its first step, and overrides of the keys ablate sets itself (``CONTROLLED_KEYS``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from seqmodels.config import Config, ConfigError

SUITES = ("perplexity", "recall", "needle", "ruler")
CONTROLLED_KEYS = ("train.run_dir", "train.steps", "train.seed", "train.exit_at_step", "data.seed",
                   "checkpoint.every_steps", "checkpoint.keep", "checkpoint.keep_period", "checkpoint.resume",
                   "log.progress")
_TOP_KEYS = {"name", "base", "overrides", "variants", "seeds", "budget", "time_limit_minutes", "eval"}
_EVAL_KEYS = {"suites", "points", "batch_size", "max_batches", "needle", "ruler"}
_NEEDLE_KEYS = {"length", "depths", "per_depth", "seed"}
_RULER_KEYS = {"lengths", "tasks", "depths", "per_depth", "seed"}


class SweepError(ValueError):
    """The sweep file cannot run as written; the message names the variant and the key."""


@dataclasses.dataclass(frozen=True)
class NeedleSettings:
    length: int = 512
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    per_depth: int = 8
    seed: int = 1234


@dataclasses.dataclass(frozen=True)
class RulerSettings:
    lengths: tuple[int, ...] = (1024,)
    tasks: tuple[str, ...] = ("niah_single_1", "niah_single_2", "niah_multikey_1")
    depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    per_depth: int = 4
    seed: int = 42


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    suites: tuple[str, ...] = ("perplexity",)
    points: int = 4
    batch_size: int = 4
    max_batches: int = 8
    needle: NeedleSettings = NeedleSettings()
    ruler: RulerSettings = RulerSettings()


@dataclasses.dataclass(frozen=True)
class Variant:
    """One variant: its config file, its overrides (``key=value`` strings for train.py) and its resolved config."""

    name: str
    config_path: str
    overrides: tuple[str, ...]
    config: Config
    steps: int
    flops_per_token: float
    parameters: int
    seeds: tuple[int, ...] | None = None  # the variant's own seeds (None: the sweep's)
    time_limit_minutes: float | None = None  # the variant's own limit per run (None: the sweep's)


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    path: str
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...]
    budget: dict
    time_limit_minutes: float
    eval: EvalSettings

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise SweepError(f"--only {name!r}: no such variant; variants: {', '.join(v.name for v in self.variants)}")


def override_string(key: str, value) -> str:
    """``key=value`` as train.py parses it: strings stay as written (``model.mixers`` is never parsed) unless
    YAML would read them as another type, other values are written as JSON (which YAML reads back)."""
    if isinstance(value, str):
        if key == "model.mixers" or yaml.safe_load(value) == value:
            return f"{key}={value}"
        return f"{key}={json.dumps(value)}"
    return f"{key}={json.dumps(value)}"


def _unknown(found: Mapping, allowed: set, where: str) -> None:
    unknown = sorted(set(found) - allowed)
    if unknown:
        raise SweepError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(sorted(allowed))}")


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SweepError(f"{where}: expected a mapping of dotted keys to values, got {type(value).__name__}")
    return dict(value)


def _eval_settings(raw) -> EvalSettings:
    raw = _mapping(raw, "eval")
    _unknown(raw, _EVAL_KEYS, "eval")
    needle_raw = _mapping(raw.get("needle"), "eval.needle")
    _unknown(needle_raw, _NEEDLE_KEYS, "eval.needle")
    ruler_raw = _mapping(raw.get("ruler"), "eval.ruler")
    _unknown(ruler_raw, _RULER_KEYS, "eval.ruler")
    suites = tuple(raw.get("suites", ("perplexity",)))
    bad = [s for s in suites if s not in SUITES]
    if bad or not suites:
        raise SweepError(f"eval.suites: {bad or 'empty'}; choose from {', '.join(SUITES)}")
    settings = EvalSettings(suites=suites, points=raw.get("points", 4), batch_size=raw.get("batch_size", 4),
                            max_batches=raw.get("max_batches", 8),
                            needle=NeedleSettings(**{k: tuple(v) if k == "depths" else v
                                                     for k, v in needle_raw.items()}),
                            ruler=_ruler_settings(ruler_raw))
    for key in ("points", "batch_size", "max_batches"):
        if not isinstance(getattr(settings, key), int) or getattr(settings, key) < 1:
            raise SweepError(f"eval.{key}: must be an int >= 1, got {getattr(settings, key)!r}")
    needle = settings.needle
    if not all(isinstance(d, (int, float)) and 0 <= d <= 1 for d in needle.depths) or not needle.depths:
        raise SweepError(f"eval.needle.depths: must be numbers in [0, 1], got {list(needle.depths)}")
    if not isinstance(needle.per_depth, int) or needle.per_depth < 1 or not isinstance(needle.length, int) \
            or needle.length < 32:
        raise SweepError("eval.needle: per_depth must be an int >= 1 and length an int >= 32")
    return settings


def _ruler_settings(raw: dict) -> RulerSettings:
    from seqmodels.data.ruler_tasks import TASKS
    for key in ("lengths", "tasks", "depths"):
        if key in raw and (isinstance(raw[key], (str, bytes)) or not isinstance(raw[key], (list, tuple))):
            raise SweepError(f"eval.ruler.{key}: expected a list, got {raw[key]!r}")
    settings = RulerSettings(**{k: tuple(v) if k in ("lengths", "tasks", "depths") else v for k, v in raw.items()})
    if not settings.lengths or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 2
                                       for n in settings.lengths):
        raise SweepError(f"eval.ruler.lengths: must be ints >= 2 (tokens), got {list(settings.lengths)}")
    unknown = [t for t in settings.tasks if t not in TASKS]
    if unknown or not settings.tasks:
        raise SweepError(f"eval.ruler.tasks: unknown or no task(s) {unknown}; choose from {', '.join(TASKS)}")
    if not settings.depths or not all(isinstance(d, (int, float)) and 0 <= d <= 1 for d in settings.depths):
        raise SweepError(f"eval.ruler.depths: must be numbers in [0, 1], got {list(settings.depths)}")
    for key in ("per_depth", "seed"):
        value = getattr(settings, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "per_depth" else 0):
            raise SweepError(f"eval.ruler.{key}: must be an int >= {1 if key == 'per_depth' else 0}, got {value!r}")
    return settings


def check_suites_fit(name: str, config: Config, settings: EvalSettings) -> None:
    """Refuse, before any run, a suite that cannot evaluate this variant (``SweepError`` naming both)."""
    from seqmodels.config import SYNTHETIC_TASKS

    if "recall" in settings.suites:
        for task in SYNTHETIC_TASKS:
            try:
                data = dataclasses.replace(config.data, source=task)
            except (ConfigError, ValueError) as error:
                raise SweepError(f"variant {name!r}: eval.suites: recall ({task}) cannot run on this config: "
                                 f"{error}") from None
            if config.model.vocab_size < data.synthetic.vocab_size:
                raise SweepError(f"variant {name!r}: eval.suites: recall needs model.vocab_size >= "
                                 f"data.synthetic.vocab_size={data.synthetic.vocab_size}")
    if "needle" in settings.suites:
        from seqmodels.evaluation.text_needle import text_needle_rows
        try:  # one example: the length holds needle, query and answer, the held-out text is long enough
            text_needle_rows(config, length=settings.needle.length, depths=[0.5], per_depth=1)
        except ValueError as error:  # DataError is a ValueError
            raise SweepError(f"variant {name!r}: eval.needle: {error}") from None
    if "ruler" in settings.suites:
        from seqmodels.models import model_kind
        if "ruler" not in model_kind(config.model).suites:
            raise SweepError(f"variant {name!r}: eval.suites: ruler needs a model kind with a generate "
                             f"(model.kind={config.model.kind} has none)")
        from seqmodels.data.sources import get_source
        if not get_source(config.data.source).encodes_text:
            raise SweepError(f"variant {name!r}: eval.suites: ruler needs a run trained on text "
                             f"(data.source={config.data.source} is not)")
        if min(settings.ruler.lengths) > config.model.max_seq_len:
            raise SweepError(f"variant {name!r}: eval.ruler.lengths {list(settings.ruler.lengths)}: every length "
                             f"exceeds model.max_seq_len={config.model.max_seq_len}")


def _steps(budget: dict, config: Config, flops_per_token: float) -> int:
    tokens_per_step = config.train.batch_size * config.data.seq_len
    if "tokens" in budget:
        return max(1, round(budget["tokens"] / tokens_per_step))
    return max(1, round(budget["flops"] / (3.0 * flops_per_token * tokens_per_step)))


def _budget(raw) -> dict:
    raw = _mapping(raw, "budget")
    if set(raw) not in ({"tokens"}, {"flops"}):
        raise SweepError(f"budget: give exactly one of tokens or flops, got {sorted(raw) or 'nothing'}")
    (key, value), = raw.items()
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise SweepError(f"budget.{key}: expected a number, got {value!r}") from None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise SweepError(f"budget.{key}: must be a positive number, got {value!r}")
    return {key: value}


def _resolve_variant(name: str, raw, base: str, shared: dict, budget: dict, root: Path) -> Variant:
    from seqmodels.config_io import load_config
    from seqmodels.models import abstract_model, flops_per_token
    from seqmodels.training.loop import validate
    from seqmodels.training.state import count_params

    where = f"variant {name!r}"
    raw = _mapping(raw, where)
    config_path = raw.pop("config", base)
    seeds = _seeds(raw.pop("seeds"), f"{where}: seeds") if "seeds" in raw else None
    limit = _limit(raw.pop("time_limit_minutes"), f"{where}: time_limit_minutes") if "time_limit_minutes" in raw \
        else None
    if not isinstance(config_path, str) or not (root / config_path).is_file():
        raise SweepError(f"{where}: config: no such file {config_path!r} (relative to {root})")
    merged = {**shared, **raw}
    for key in merged:
        if key in CONTROLLED_KEYS:
            raise SweepError(f"{where}: key {key!r} is set by ablate.py for every run; remove it "
                             "(the budget sets train.steps, the seeds train.seed and data.seed)")
    overrides = tuple(override_string(k, v) for k, v in merged.items())
    try:
        config = load_config(root / config_path, overrides)
        validate(config, _single_device_mesh())
    except (ConfigError, ValueError) as error:
        raise SweepError(f"{where}: {error}") from None
    flops = flops_per_token(config.model, config.data.seq_len)
    _, abstract_state = abstract_model(config.model)
    return Variant(name, config_path, overrides, config, _steps(budget, config, flops), flops,
                   count_params(_params(abstract_state)), seeds, limit)


def _seeds(seeds, where: str) -> tuple[int, ...]:
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise SweepError(f"{where}: must be a list of distinct ints >= 0, got {seeds!r}")
    return tuple(seeds)


def _limit(limit, where: str) -> float:
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
        raise SweepError(f"{where}: must be a number >= 0 (0 = none), got {limit!r}")
    return float(limit)


def _params(abstract_state):
    from flax import nnx
    return nnx.to_pure_dict(abstract_state)


def _single_device_mesh():
    """A mesh shape stand-in for ``loop.validate`` (which only reads ``mesh.shape``)."""
    from seqmodels.sharding import MESH_AXES
    return type("MeshShape", (), {"shape": dict.fromkeys(MESH_AXES, 1)})()


def load_sweep(path: str | os.PathLike, root: str | os.PathLike = ".") -> Sweep:
    """The sweep of the YAML file ``path`` (module docstring); config paths are relative to ``root``."""
    path, root = Path(path), Path(root)
    if not path.is_file():
        raise SweepError(f"--sweep {str(path)!r}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise SweepError(f"{path}: not readable YAML ({error})") from None
    raw = _mapping(raw, str(path))
    _unknown(raw, _TOP_KEYS, str(path))
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name or "/" in name:
        raise SweepError(f"name: must be a non-empty string without '/', got {name!r}")
    base = raw.get("base")
    if not isinstance(base, str):
        raise SweepError("base: name the config file every variant starts from, e.g. base: configs/transformer.yaml")
    variants_raw = _mapping(raw.get("variants"), "variants")
    if not variants_raw:
        raise SweepError("variants: name at least one variant")
    seeds = _seeds(raw.get("seeds", [0]), "seeds")
    limit = _limit(raw.get("time_limit_minutes", 0), "time_limit_minutes")
    budget = _budget(raw.get("budget"))
    shared = _mapping(raw.get("overrides"), "overrides")
    settings = _eval_settings(raw.get("eval"))
    variants = []
    for variant_name, overrides in variants_raw.items():
        if not isinstance(variant_name, str) or not variant_name.replace("_", "").replace("-", "").isalnum():
            raise SweepError(f"variants: name {variant_name!r} must be letters, digits, '_' or '-'")
        variant = _resolve_variant(variant_name, overrides, base, shared, budget, root)
        check_suites_fit(variant_name, variant.config, settings)
        variants.append(variant)
    return Sweep(name, str(path), tuple(variants), seeds, budget, limit, settings)
