"""The ``ahn`` suite (``eval.py --suites ahn``): what the compressors buy over sliding window + sinks alone.

For an AHN run at window ``W`` (``model.ahn.window``, or ``window=``), three models from one parameter
set: the teacher (full attention), ``swa`` (sliding window + sinks, compressors off) and ``ahn``.

- ``loss``: next-token cross-entropy (nats) on held-out rows of ``T = m W`` tokens (``m`` in
  ``multiples``, default 2, 4, 8), averaged over positions ``>= W`` (those the window cuts), and
  ``by_position``: the same per bucket of ``W / 2`` positions (for plots); ``interval``: each model's 95 %
  percentile-bootstrap interval over the rows (``seqmodels.evaluation.intervals``, rows weighted by their
  scored tokens), and ``recovered``: the share of sliding window's gap to the teacher that AHN recovers,
  ``(swa - ahn) / (swa - teacher)``, with its interval (the same rows resampled for all three);
- ``retrieval``: a key-value needle (`` The secret number of <key> is <value>.``) placed right after the
  sinks, then held-out text, then the query `` The secret number of <key> is``: more than ``W`` tokens
  separate needle and query, so only the teacher sees the needle; accuracy = every value token predicted
  (greedy, teacher-forced) over ``retrieval_examples`` needles;
- ``cost``: forward FLOPs per token (the registry's formulas: ``ahn_flops_per_token`` against
  ``lm_flops_per_token`` of the base) and decoding cache bytes (the cache pytrees' shapes, nothing
  allocated) at 32k and 128k tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from seqmodels.config import Config, ConfigError
from seqmodels.data.pipeline import make_eval_batches
from seqmodels.data.tokenizers import get_tokenizer
from seqmodels.evaluation.intervals import bootstrap_interval, ratio_interval
from seqmodels.models import build_model, model_kind
from seqmodels.models.ahn import ahn_flops_per_token
from seqmodels.models.lm import lm_flops_per_token

MODES = ("teacher", "swa", "ahn")
COST_LENGTHS = (32768, 131072)


@nnx.jit(static_argnames=("window", "sinks"))
def _token_losses(model, inputs, targets, *, window: int, sinks: int):
    """``[3, B, T]`` cross-entropies of the teacher, sliding window alone and AHN."""
    hidden = (model.hidden(inputs), model.hidden(inputs, window=window, sinks=sinks, compress=False),
              model.hidden(inputs, window=window, sinks=sinks))
    return jnp.stack([optax.softmax_cross_entropy_with_integer_labels(model.logits(h), targets) for h in hidden])


def check_window(config: Config, window: int, lengths) -> None:
    sinks = config.model.ahn.sinks
    if window <= sinks:
        raise ConfigError(f"model.ahn.window={window} must exceed model.ahn.sinks={sinks}")
    for length in lengths:
        if window >= length:
            raise ConfigError(f"model.ahn.window={window} must be below the evaluation length {length}: "
                              "positions beyond the window are what the suite measures")
        if length > config.model.max_seq_len:
            raise ConfigError(f"evaluation length {length} exceeds model.max_seq_len={config.model.max_seq_len}; "
                              "evaluate a smaller model.ahn.window or fewer multiples")


def loss_beyond_window(model, config: Config, window: int, length: int, *, batch_size: int, max_batches: int):
    data = dataclasses.replace(config.data, seq_len=length)
    row_sums, row_counts = [], []  # per held-out row: [modes] summed losses beyond the window, their count
    buckets = max(1, window // 2)
    bucket_sums = np.zeros((len(MODES), -(-length // buckets)))
    bucket_counts = np.zeros(-(-length // buckets))
    for batch in make_eval_batches(data, batch_size=batch_size, max_batches=max_batches):
        losses = np.asarray(_token_losses(model, jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"]),
                                          window=window, sinks=config.model.ahn.sinks))
        mask = np.asarray(batch["loss_mask"]) > 0
        beyond = mask & (np.arange(length) >= window)[None]
        row_sums += list((losses.astype(np.float64) * beyond[None]).sum(axis=2).T)
        row_counts += list(beyond.sum(axis=1))
        index = np.arange(length) // buckets
        for b in range(bucket_counts.shape[0]):
            selected = mask & (index == b)[None]
            bucket_sums[:, b] += (losses * selected).sum(axis=(1, 2))
            bucket_counts[b] += selected.sum()
    kept = [i for i, count in enumerate(row_counts) if count > 0]
    if not kept:
        raise ValueError(f"the held-out rows of {length} tokens hold no position >= window {window}")
    sums = np.asarray([row_sums[i] for i in kept], np.float64)
    counts = np.asarray([row_counts[i] for i in kept], np.float64)
    means = {mode: float(sums[:, m].sum() / counts.sum()) for m, mode in enumerate(MODES)}
    by_position = [{"positions": [b * buckets, min((b + 1) * buckets, length)],
                    **{mode: float(bucket_sums[m, b] / bucket_counts[b]) for m, mode in enumerate(MODES)}}
                   for b in range(bucket_counts.shape[0]) if bucket_counts[b]]
    teacher, swa, ahn = (sums[:, MODES.index(mode)] for mode in MODES)
    gap = swa - teacher
    recovered = {"share": float((swa - ahn).sum() / gap.sum()) if gap.sum() != 0 else None,
                 "interval": ratio_interval(swa - ahn, gap) if len(kept) > 1 and gap.sum() != 0 else None}
    intervals = {mode: bootstrap_interval(sums[:, m] / counts, counts) if len(kept) > 1 else None
                 for m, mode in enumerate(MODES)}
    return {"length": length, "tokens": int(counts.sum()), "rows": len(kept), **means, "interval": intervals,
            "recovered": recovered, "by_position": by_position}


def _filler_rows(config: Config, length: int, count: int) -> list[list[int]]:
    """``count`` held-out rows of ``length`` tokens (cycled when fewer rows are held out)."""
    rows = make_eval_batches(dataclasses.replace(config.data, seq_len=length), batch_size=count, max_batches=1)[0]
    kept = [[int(t) for t in row] for row, mask in zip(rows["inputs"], rows["loss_mask"]) if np.asarray(mask).any()]
    if not kept:
        raise ValueError(f"no held-out row of {length} tokens to hide the needles in")
    return [kept[i % len(kept)] for i in range(count)]


def retrieval(model, config: Config, window: int, *, examples: int, seed: int = 0) -> dict:
    """Accuracy of the three models on needles placed before the window (module docstring)."""
    tokenizer = get_tokenizer(config.data.tokenizer)
    sinks, length = config.model.ahn.sinks, 2 * window
    rng = np.random.default_rng(seed)
    correct = np.zeros(len(MODES))
    for filler in _filler_rows(config, length, examples):
        key, value = (int(n) for n in rng.integers(1000, 10000, size=2))
        needle = list(tokenizer.encode(f" The secret number of {key} is {value}."))
        query = list(tokenizer.encode(f" The secret number of {key} is"))
        answer = list(tokenizer.encode(f" {value}"))
        gap = length - sinks - len(needle) - len(query) - len(answer)
        if gap <= window:
            raise ConfigError(f"model.ahn.window={window}: the retrieval rows of {length} tokens cannot separate "
                              "needle and query by more than the window")
        row = filler[:sinks] + needle + filler[sinks:sinks + gap] + query + answer
        predictions = np.asarray(_predictions(model, jnp.asarray([row[:-1]], jnp.int32), window=window, sinks=sinks))
        slots = np.arange(len(row) - 1 - len(answer), len(row) - 1)  # inputs whose next token is an answer token
        correct += (predictions[:, 0, slots] == np.asarray(row)[slots + 1]).all(axis=1)
    return {"examples": examples, "row_tokens": length, **{mode: float(correct[m] / examples)
                                                            for m, mode in enumerate(MODES)}}


@nnx.jit(static_argnames=("window", "sinks"))
def _predictions(model, inputs, *, window: int, sinks: int):
    hidden = (model.hidden(inputs), model.hidden(inputs, window=window, sinks=sinks, compress=False),
              model.hidden(inputs, window=window, sinks=sinks))
    return jnp.stack([jnp.argmax(model.logits(h), axis=-1) for h in hidden])


def cache_bytes(model, length: int) -> int:
    """Bytes of ``model``'s decoding cache for one row of ``length`` tokens (shapes only)."""
    shapes = jax.eval_shape(lambda: model.init_cache(1, length))
    return int(sum(np.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes)))


def cost(model, config: Config, window: int) -> dict:
    ahn_config = dataclasses.replace(config.model, ahn=dataclasses.replace(config.model.ahn, window=window))
    lm_config = dataclasses.replace(config.model, kind="lm", max_seq_len=max(COST_LENGTHS))
    lm = nnx.eval_shape(lambda: build_model(lm_config))
    ahn = nnx.eval_shape(lambda: build_model(ahn_config))
    rows = {}
    for length in COST_LENGTHS:
        full, compressed = lm_flops_per_token(lm_config, length), ahn_flops_per_token(ahn_config, length)
        full_cache, ahn_cache = cache_bytes(lm, length), cache_bytes(ahn, length)
        rows[str(length)] = {"flops_per_token": {"full_attention": full, "ahn": compressed,
                                                 "ahn_over_full": compressed / full},
                             "cache_bytes": {"full_attention": full_cache, "ahn": ahn_cache,
                                             "ahn_over_full": ahn_cache / full_cache}}
    return rows


def evaluate_ahn(model, config: Config, *, window: int | None = None, multiples=(2, 4, 8), batch_size: int = 1,
                 max_batches: int = 4, retrieval_examples: int = 16) -> dict:
    """The suite's JSON dict (module docstring)."""
    if "ahn" not in model_kind(config.model).suites:
        raise ConfigError(f"the ahn suite needs an AHN run (model.kind=ahn), got model.kind={config.model.kind!r}")
    window = config.model.ahn.window if window is None else window
    lengths = [m * window for m in multiples]
    check_window(config, window, lengths)
    return {"window": window, "sinks": config.model.ahn.sinks, "compressor": config.model.ahn.compressor,
            "loss": [loss_beyond_window(model, config, window, length, batch_size=batch_size,
                                        max_batches=max_batches) for length in lengths],
            "retrieval": retrieval(model, config, window, examples=retrieval_examples),
            "cost": cost(model, config, window)}


def _with_interval(value: float, interval: dict | None, digits: int) -> str:
    if interval is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _recovered(recovered: dict | None) -> str:
    if not recovered or recovered["share"] is None:
        return "n/a (no gap)"
    return _with_interval(100 * recovered["share"], None if recovered["interval"] is None else
                          {k: 100 * recovered["interval"][k] for k in ("low", "high")}, 1) + " %"


def markdown_table(result: dict) -> str:
    """The suite's result as markdown: loss beyond the window per length, retrieval, cost."""
    lines = [f"AHN ({result['compressor']}), window {result['window']} with {result['sinks']} sinks", "",
             "| T | rows | tokens scored | teacher (full) | sliding window | AHN | gap recovered |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {row['length']} | {row.get('rows', '')} | {row['tokens']} | "
              + " | ".join(_with_interval(row[mode], row.get("interval", {}).get(mode), 4) for mode in MODES)
              + f" | {_recovered(row.get('recovered'))} |" for row in result["loss"]]
    found = result["retrieval"]
    lines += ["", f"Needle retrieval ({found['examples']} needles, > window tokens before the query): "
              f"teacher {found['teacher']:.2f}, sliding window {found['swa']:.2f}, AHN {found['ahn']:.2f}", "",
              "| tokens | FLOPs/token full | FLOPs/token AHN | ratio | cache full | cache AHN | ratio |",
              "|---|---|---|---|---|---|---|"]
    for length, row in result["cost"].items():
        flops, cache = row["flops_per_token"], row["cache_bytes"]
        lines.append(f"| {length} | {flops['full_attention']:.3e} | {flops['ahn']:.3e} | {flops['ahn_over_full']:.3f} "
                     f"| {cache['full_attention'] / 2**20:.1f} MiB | {cache['ahn'] / 2**20:.1f} MiB "
                     f"| {cache['ahn_over_full']:.4f} |")
    return "\n".join(lines) + "\n"
