"""Held-out loss and perplexity, overall and per position bucket.

Loss is next-token cross-entropy in nats per token (a token is a byte for the byte tokenizer, so
``bits_per_byte = loss / ln 2``). Position is the token's index within its document: bucket ``b``
holds positions ``[2^(b-1), 2^b)`` (bucket 0 is position 0), so the curve shows how loss falls as
more context is available.

Uncertainty: ``interval`` is a 95 % percentile bootstrap of the loss over the documents of the held-out
sample (``seqmodels.data.heldout_sample``; each document's tokens resampled together,
``seqmodels.evaluation.intervals``), seeded by ``data.heldout_seed``; ``perplexity_interval`` is its
exp. A source without documents (generated tasks) resamples rows instead (``interval["units_are"]``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from seqmodels.data.pipeline import make_eval_batches
from seqmodels.evaluation.intervals import bootstrap_interval


@nnx.jit
def _token_losses(model, batch):
    logits, _ = model(batch["inputs"], segment_ids=batch["segment_ids"], positions=batch["positions"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])


def position_buckets(seq_len: int) -> list[tuple[int, int]]:
    """``[(0, 1), (1, 2), (2, 4), (4, 8), ...]`` up to ``seq_len``."""
    buckets, low = [(0, 1)], 1
    while low < seq_len:
        buckets.append((low, min(2 * low, seq_len)))
        low *= 2
    return buckets


def evaluate_perplexity(model, config, *, batch_size: int = 8, max_batches: int = 16) -> dict:
    """Mean held-out loss, perplexity, bits per token, and loss per position bucket."""
    batches = make_eval_batches(config.data, batch_size=batch_size, max_batches=max_batches)
    buckets = position_buckets(config.data.seq_len)
    sums, counts = np.zeros(len(buckets)), np.zeros(len(buckets))
    unit_ids, unit_losses = [], []  # the document (or row) of the sample of each loss token, and its loss
    for number, batch in enumerate(batches):
        losses = np.asarray(jax.device_get(_token_losses(model, {k: jnp.asarray(v) for k, v in batch.items()
                                                                 if k != "documents"})))
        mask = np.asarray(batch["loss_mask"]) > 0
        positions = np.asarray(batch["positions"])
        units = batch.get("documents")
        if units is None:  # rows are the units: a global row number per row
            rows = number * len(mask) + np.arange(len(mask))
            units = np.broadcast_to(rows[:, None], mask.shape)
        unit_ids.append(np.asarray(units)[mask])
        unit_losses.append(losses[mask])
        for i, (low, high) in enumerate(buckets):
            selected = mask & (positions >= low) & (positions < high)
            sums[i] += losses[selected].sum()
            counts[i] += selected.sum()
    total = counts.sum()
    if total == 0:
        raise ValueError("the held-out batches hold no loss tokens")
    loss = float(sums.sum() / total)
    _, unit_index = np.unique(np.concatenate(unit_ids), return_inverse=True)
    unit_tokens = np.bincount(unit_index)
    unit_mean = np.bincount(unit_index, weights=np.concatenate(unit_losses).astype(np.float64)) / unit_tokens
    interval = bootstrap_interval(unit_mean, unit_tokens, seed=config.data.heldout_seed)
    interval["units_are"] = "documents" if "documents" in batches[0] else "rows"
    return {
        "loss": loss,
        "interval": interval,
        "perplexity": math.exp(loss),
        "perplexity_interval": [math.exp(interval["low"]), math.exp(interval["high"])],
        "bits_per_token": loss / math.log(2),
        "tokens": int(total),
        "batches": len(batches),
        "by_position": [
            {"positions": [low, high], "loss": float(s / c) if c else None, "tokens": int(c)}
            for (low, high), s, c in zip(buckets, sums, counts)],
    }


def plot_loss_by_position(result: dict, path) -> None:
    """A PNG of held-out loss against position (log-scaled x axis)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [b for b in result["by_position"] if b["loss"] is not None]
    x = [max(b["positions"][0], 0.5) for b in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [b["loss"] for b in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in document (bucket start)")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.set_title(f"loss {result['loss']:.3f}, perplexity {result['perplexity']:.2f}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
