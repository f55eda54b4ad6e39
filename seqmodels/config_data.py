"""``data``: where tokens come from and how they are packed into rows (``DataConfig``), with the sections of
the generated sources (``data.synthetic``, ``data.cfl``). Re-exported by ``seqmodels.config``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seqmodels.config_base import MAX_TOKENS, _require, _require_at_least, _require_at_most, _require_choices, describe


def needle_min_length(key_length: int, value_length: int, distractors: int) -> int:
    """Fewest tokens of a needle-in-a-haystack row: BOS, the needles ' #key=value.', the query
    ' #key=' and its answer, and one filler byte (``seqmodels.data.sources.needle`` writes this layout)."""
    return 1 + (1 + distractors) * (4 + key_length + value_length) + (3 + key_length) + value_length + 1


SYNTHETIC_TASKS = ("mqar", "selective_copy")


@dataclass(frozen=True)
class SyntheticConfig:
    """Generated recall tasks (``data.source: mqar | selective_copy``; ``seqmodels.data.sources.recall``).

    Token ids: 0 blank, 1 BOS, 2 separator, then MQAR keys and values (the rest of the vocabulary
    split in two halves) or selective-copying content tokens. One example fills one row.
    """

    vocab_size: int = describe("token ids the tasks use (the model's vocab_size must cover them)", 256)
    num_pairs: int = describe("mqar: key-value pairs at the start of each row", 8)
    num_queries: int = describe("mqar: queries later in the row, each a key drawn uniformly; 0 = num_pairs", 0)
    num_copy_tokens: int = describe("selective_copy: content tokens scattered in the row, then copied", 16)

    def __post_init__(self):
        _require_at_least(self, "data.synthetic", vocab_size=8, num_pairs=1, num_queries=0, num_copy_tokens=1)
        keys = (self.vocab_size - 3) // 2
        _require(self.num_pairs <= keys, "data.synthetic.num_pairs",
                 f"{self.num_pairs} pairs need as many distinct keys; data.synthetic.vocab_size="
                 f"{self.vocab_size} has {keys}")

    def check_fits(self, source: str, seq_len: int) -> None:
        """Raise ``ConfigError`` unless one example of ``source`` fits a row of ``seq_len + 1`` tokens."""
        if source == "mqar":
            queries = self.num_queries or self.num_pairs
            need = 2 * self.num_pairs + 2 * queries
            _require(need <= seq_len, "data.seq_len",
                     f"{seq_len} cannot hold BOS + data.synthetic.num_pairs={self.num_pairs} pairs + {queries} "
                     f"query-answer pairs; set data.seq_len >= {need}")
        elif source == "selective_copy":
            need = 2 * self.num_copy_tokens + 1
            _require(need <= seq_len, "data.seq_len",
                     f"{seq_len} cannot hold BOS + data.synthetic.num_copy_tokens={self.num_copy_tokens} tokens, "
                     f"a separator and their copy; set data.seq_len >= {need}")


CFL_LANGUAGES = ("dyck1", "dyck2", "marked_palindrome", "palindrome", "anbn_cmdm", "ambiguous", "bfvp")


@dataclass(frozen=True)
class CflDataConfig:
    """``data.source: cfl``: labelled strings of context-free languages (``seqmodels.data.cfl``), one per row."""

    languages: tuple[str, ...] = describe("languages to train on; each example's [BOS] token names its language",
                                          factory=lambda: CFL_LANGUAGES)
    min_length: int = describe("shortest training string", 1)
    max_length: int = describe("longest training string; a language uses its lengths in [min, max] with positives",
                               32)
    length_buckets: int = describe(
        "each training batch holds lengths from one of this many equal ranges of [min, max], in rows as long as "
        "that range needs (1: every row data.seq_len; cheaper with more, but on dyck2 it learned slower)", 1)
    curriculum_steps: int = describe(
        "length curriculum: the k-th of the length_buckets ranges enters training at batch k/length_buckets of "
        "this many (0 = all ranges from the start)", 0)

    def __post_init__(self):
        _require(len(self.languages) >= 1, "data.cfl.languages", "needs at least one language")
        unknown = [name for name in self.languages if name not in CFL_LANGUAGES]
        _require(not unknown, "data.cfl.languages", f"unknown {unknown}; known: {', '.join(CFL_LANGUAGES)}")
        _require(len(set(self.languages)) == len(self.languages), "data.cfl.languages",
                 f"lists a language twice: {list(self.languages)}")
        _require(self.min_length >= 1, "data.cfl.min_length", f"must be >= 1, got {self.min_length}")
        _require(self.max_length >= self.min_length, "data.cfl.max_length",
                 f"{self.max_length} is below data.cfl.min_length={self.min_length}")
        _require_at_least(self, "data.cfl", length_buckets=1, curriculum_steps=0)


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are packed into rows."""

    source: str = describe("a source registered in seqmodels.data.sources: stdlib (Python's own source files, on"
                           " every machine) | text_files | arrayrecord | jsonl | parquet | mqar | selective_copy (generated,"
                           " data.synthetic) | needle (generated needle-in-a-haystack rows, data.needle_*) | ruler (RULER's tasks,"
                           " data.ruler_tasks) | cfl"
                           " (context-free languages, data.cfl)", "stdlib")
    path: str = describe("glob of text files (text_files), ArrayRecord shards (arrayrecord), JSON-lines files (jsonl) "
                         "or Parquet files (parquet)", "")
    text_field: str = describe("jsonl / parquet: the field (column) holding each document's text", "text")
    heldout_path: str = describe("glob of the held-out documents, read like data.path; when set, every document of "
                                 "data.path trains and data.heldout_fraction is unused; empty = hash split", "")
    tokenizer: str = describe("byte: UTF-8 bytes + begin- and end-of-document tokens | hf:DIR: the tokenizer.json "
                              "of a Hugging Face directory (seqmodels.hf.load_tokenizer)", "byte")
    seq_len: int = describe("tokens per training row", 256)
    heldout_fraction: float = describe("share of documents held out for evaluation (chosen by hash)", 0.02)
    max_documents: int = describe("use at most this many documents; 0 = all", 0)
    seed: int = describe("seed of the document shuffle (generated tasks: of the generated examples)", 0)
    heldout_seed: int = describe("seed of the held-out sample: evaluation reads the held-out documents in the "
                                 "random order this seed draws, each cut to one row (data.seq_len + 1 tokens)", 0)
    synthetic: SyntheticConfig = describe("generated recall tasks (data.source = mqar | selective_copy)",
                                          factory=SyntheticConfig)
    needle_key_length: int = describe("needle: digits of the key of the needle (and of the query)", 2)
    needle_value_length: int = describe("needle: digits of the value to retrieve (the scored answer)", 2)
    needle_distractors: int = describe("needle: other key-value pairs hidden in the haystack", 0)
    ruler_tasks: tuple[str, ...] = describe(
        "ruler: the RULER tasks of the training rows (seqmodels.data.ruler_tasks.TASKS), one per row in turn",
        ("niah_single_1",))
    cfl: CflDataConfig = describe("context-free-language recognition data (data.source = cfl)",
                                  factory=CflDataConfig)

    def __post_init__(self):
        # data.source is looked up in the source registry (seqmodels.data.sources), which refuses an unknown name
        # and runs the source's own check (text_files, arrayrecord: data.path); the checks below run at load.
        _require_choices(self, "data")
        self._check_tokenizer()
        self.synthetic.check_fits(self.source, self.seq_len)
        _require(self.source != "cfl" or self.seq_len >= self.cfl.max_length + 2, "data.seq_len",
                 f"{self.seq_len} cannot hold [BOS] + data.cfl.max_length={self.cfl.max_length} symbols + [CLS]; "
                 f"set data.seq_len >= {self.cfl.max_length + 2}")
        _require(self.seq_len >= 1, "data.seq_len", f"must be >= 1, got {self.seq_len}")
        _require_at_most(self, "data", seq_len=MAX_TOKENS, needle_key_length=64, needle_value_length=64,
                         needle_distractors=MAX_TOKENS)
        _require(0.0 < self.heldout_fraction < 1.0, "data.heldout_fraction",
                 f"must be in (0, 1), got {self.heldout_fraction}")
        _require(self.max_documents >= 0, "data.max_documents", "must be >= 0")
        _require(bool(self.text_field), "data.text_field", "must not be empty")
        _require_at_least(self, "data", needle_key_length=1, needle_value_length=1, needle_distractors=0, seed=0,
                          heldout_seed=0)
        if self.source == "needle":
            shortest = needle_min_length(self.needle_key_length, self.needle_value_length, self.needle_distractors)
            _require(self.seq_len + 1 >= shortest, "data.seq_len",
                     f"{self.seq_len} is too short for a needle row: needs seq_len >= {shortest - 1}")
            _require(10**self.needle_key_length > self.needle_distractors, "data.needle_distractors",
                     f"{self.needle_distractors} distractors need more distinct keys than "
                     f"{self.needle_key_length} digits give")


    def _check_tokenizer(self) -> None:
        _require(self.tokenizer == "byte" or self.tokenizer.startswith("hf:"), "data.tokenizer",
                 f"must be byte or hf:DIR (a Hugging Face directory with a tokenizer.json), got {self.tokenizer!r}")
        if self.tokenizer.startswith("hf:"):
            directory = Path(self.tokenizer[len("hf:"):])
            _require(directory.is_dir(), "data.tokenizer", f"{self.tokenizer}: no such directory {str(directory)!r}")
            _require((directory / "tokenizer.json").is_file(), "data.tokenizer",
                     f"{self.tokenizer}: the directory has no tokenizer.json")
