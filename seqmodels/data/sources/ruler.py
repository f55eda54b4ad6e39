"""RULER's tasks as training data: the source ``ruler`` (``data.ruler_tasks``).

Each row is one example of ``seqmodels.data.ruler_tasks`` at length ``data.seq_len + 1`` in
``data.tokenizer``'s tokens: the prompt (``length - max_new_tokens`` tokens, opening token first), then the
answer as the suite expects it (``answer_text``: the references ``", "``-joined, then ``"."``) and the
end-of-document token, then end-of-document padding up to the row's length. Loss only on the answer and the
end-of-document token after it (what greedy decoding must produce before it stops), so the model is trained on
the format ``eval.py --suites ruler`` scores.

Rows cycle through ``data.ruler_tasks`` in turn (row ``i``: task ``i mod len(tasks)``); each row draws its needle
depth uniformly in [0, 1] and its needles, keys and haystack from a generator seeded by ``(data.seed, i)``; a draw
that does not fit the row (near a task's shortest length, a key that tokenizes long) is drawn again from the same
generator, so a row stays a function of ``(data.seed, i)``. ``check_ruler`` refuses a length at which the first
rows of a task need more than ``MAX_DRAWS`` draws.

The essay haystack is the training split of the ``stdlib`` corpus (the ruler suite reads its held-out split), so
no held-out sentence is trained on. Training and held-out rows use prompt seeds at or above ``2**48`` (the suite's
default seed is 42, so no prompt the suite scores at its own seed is trained on).
"""

from __future__ import annotations

import dataclasses
import functools

import grain
import numpy as np

from seqmodels.config import ConfigError, DataConfig
from seqmodels.data.packing import pack_and_batch, pad_batch
from seqmodels.data.ruler_tasks import TASKS, answer_text, essay_from, needs_essay, ruler_examples
from seqmodels.data.sources import DataSource, register_source
from seqmodels.data.tokenizers import get_tokenizer

_SEED_BASE = 2**48  # prompt seeds of this source: far above any seed the suite is run with
_SPLITS = {"train": 0, "eval": 1}
ESSAY_CHARS_PER_TOKEN = 8  # stdlib training text read for the essay haystack: this many characters per row token,
ESSAY_MIN_CHARS = 1_000_000  # and at least this many, so rows start at many different sentences
CHECKED_ROWS = 8  # rows of each task ``check_ruler`` builds
MAX_DRAWS = 16  # draws of a row before its length is declared too short
_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


@functools.lru_cache(maxsize=4)
def _training_sentences(needed_chars: int) -> tuple[str, ...]:
    """Sentences of the stdlib corpus's training documents, in file order, at least ``needed_chars`` long."""
    from seqmodels.data.document_split import load_documents
    documents = load_documents(DataConfig(source="stdlib")).train
    return tuple(essay_from(documents, range(len(documents)), needed_chars))


def ruler_element(cfg: DataConfig, split: str, index: int, tokenizer=None) -> dict[str, np.ndarray]:
    """Row ``index`` of ``split`` (module docstring) as a packable element of ``data.seq_len + 1`` tokens."""
    tokenizer = tokenizer or get_tokenizer(cfg.tokenizer)
    tasks = cfg.ruler_tasks
    task = tasks[index % len(tasks)]
    length = cfg.seq_len + 1
    rng = np.random.default_rng([cfg.seed, _SPLITS[split], int(index)])
    sentences = _training_sentences(max(ESSAY_MIN_CHARS, ESSAY_CHARS_PER_TOKEN * length)) if needs_essay([task]) else ()
    for _ in range(MAX_DRAWS):  # near a task's shortest length some keys tokenize too long to fit: draw again
        depth = float(rng.uniform(0.0, 1.0))
        seed = _SEED_BASE + int(rng.integers(0, 2**40))
        try:
            example, = ruler_examples(task, tokenizer, length=length, depths=[depth], per_depth=1, seed=seed,
                                      sentences=sentences)
            break
        except ValueError as error:
            failure = error
    else:
        raise ValueError(f"{failure} (none of {MAX_DRAWS} draws fit)")
    _, close = tokenizer.document_ids()
    answer = np.concatenate([np.asarray(tokenizer.encode(answer_text(example.references)), np.int32), [close]])
    tokens = np.full(length, close, np.int32)
    tokens[:example.prompt.size] = example.prompt
    tokens[example.prompt.size:example.prompt.size + answer.size] = answer
    loss_mask = np.zeros(length, np.float32)
    loss_mask[example.prompt.size:example.prompt.size + answer.size] = 1.0
    return {"tokens": tokens, "loss_mask": loss_mask}


@dataclasses.dataclass(frozen=True)
class _RulerRow:
    """Index ``i`` -> ``split``'s row ``i`` (``ruler_element``; a picklable map for grain)."""

    cfg: DataConfig
    split: str

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        return ruler_element(self.cfg, self.split, int(index))


def ruler_train_dataset(cfg: DataConfig, *, batch_size: int, process_index: int = 0,
                        process_count: int = 1) -> grain.IterDataset:
    """Endless training batches of RULER rows; process ``p`` takes rows ``p, p + P, ...``."""
    rows = grain.MapDataset.range(0, 2**40)[process_index::process_count].map(_RulerRow(cfg, "train"))
    return pack_and_batch(rows.to_iter_dataset(_READ_OPTIONS), seq_len=cfg.seq_len, batch_size=batch_size)


def ruler_eval_batches(cfg: DataConfig, *, batch_size: int, max_batches: int) -> list[dict]:
    """``max_batches`` batches of held-out RULER rows (seeds disjoint from training); the same on every process."""
    rows = grain.MapDataset.range(0, batch_size * max_batches).map(_RulerRow(cfg, "eval"))
    batches = pack_and_batch(rows.to_iter_dataset(_READ_OPTIONS), seq_len=cfg.seq_len, batch_size=batch_size,
                             drop_remainder=False)
    return [pad_batch(batch, batch_size) for batch in batches]


def check_ruler(cfg: DataConfig) -> None:
    """``ConfigError`` for an unknown task, or a task whose prompt and answer cannot fit ``data.seq_len + 1``."""
    unknown = [task for task in cfg.ruler_tasks if task not in TASKS]
    if unknown or not cfg.ruler_tasks:
        raise ConfigError(f"data.ruler_tasks: unknown or no task(s) {unknown}; choose from {', '.join(TASKS)}")
    tokenizer = get_tokenizer(cfg.tokenizer)
    for task in cfg.ruler_tasks:
        single = dataclasses.replace(cfg, ruler_tasks=(task,))
        try:
            for index in range(CHECKED_ROWS):
                ruler_element(single, "eval", index, tokenizer)
        except ValueError as error:
            raise ConfigError(f"data.seq_len={cfg.seq_len}: {error} (a row holds data.seq_len + 1 tokens)") from None


def describe_ruler(cfg: DataConfig) -> str:
    return (f"RULER rows of {cfg.seq_len + 1} {cfg.tokenizer} tokens, one example each, tasks "
            f"{', '.join(cfg.ruler_tasks)} in turn, loss on the answer; seed {cfg.seed}")


def ruler_vocab_size(cfg: DataConfig) -> int:
    return get_tokenizer(cfg.tokenizer).vocab_size


register_source("ruler", DataSource(train=ruler_train_dataset, eval=ruler_eval_batches, vocab_size=ruler_vocab_size,
                                    describe=describe_ruler, check=check_ruler, encodes_text=True))
