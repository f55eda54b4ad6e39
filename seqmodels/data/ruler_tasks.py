"""RULER's synthetic tasks as token prompts of an exact length, generated offline from a seed.

RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?",
github.com/NVIDIA/RULER ``scripts/data/synthetic``) sizes every task so that prompt + generated tokens
fill ``length`` tokens of the model's tokenizer. The tasks (names as in RULER's ``synthetic.yaml``):

- ``niah_*``: needles ``"One of the special magic {numbers|uuids} for {key} is: {value}."`` hidden in a
  haystack, then ``"What are all the special magic {kind} for {keys} mentioned in the provided text?"``
  and the answer prefix ``" The special magic {kind} for {keys} mentioned in the provided text are"``
  (singular wording when one value is asked, as RULER rewrites it). Haystacks: ``noise`` (RULER's
  ``"The grass is green. The sky is blue. ..."`` repeated, one per line), ``essay`` (held-out text split
  into sentences) and ``needle`` (distractor needles with other keys and values, one per line). Variants:
  ``niah_single_1`` (noise, number: the passkey test), ``niah_single_2`` (essay, number),
  ``niah_single_3`` (essay, uuid), ``niah_multikey_1`` (essay, 4 keys, 1 asked),
  ``niah_multikey_2`` (needle haystack), ``niah_multikey_3`` (needle haystack, uuid keys and values),
  ``niah_multivalue`` (one key holds 4 values, all asked), ``niah_multiquery`` (4 keys asked).
  Values: 7-digit numbers or version-4 UUIDs; every value of a prompt occurs in it exactly once.
- ``vt`` (variable tracking): one chain ``VAR A = 12345``, ``VAR B = VAR A``, ... of 4 hops in the
  noise haystack, a one-shot example of the task before it (RULER's in-context example), question
  ``"Find all variables that are assigned the value {value} in the text above."``; the references are
  the chain's 5 variable names.
- ``cwe`` (common words): a numbered list in which 10 words occur ``freq_cw`` times and the others
  ``freq_ucw`` times (6 / 1 below 4096 tokens, 30 / 3 from 4096, as RULER), one solved example first;
  the references are the 10 common words.
- ``fwe`` (frequent words): coded words drawn with Zipf counts ``n k^-2 / zeta(2)`` over a vocabulary
  of ``max(length // 50, 5)`` six-letter words, the top-ranked word replaced by ``...`` (noise); the
  references are ranks 2-4.

Depth: a needle task puts the first asked needle (``vt``: the chain's first assignment) at fraction
``depth`` of the haystack's units (RULER draws it from 40 depths; here the caller sweeps it); the other
needles take depths drawn from RULER's 40, the rest of a chain follows at random later units.
``cwe`` / ``fwe`` have no depth (``None``).

Where this must differ from RULER, and why:
- Haystacks are offline: ``essay`` is held-out text of the run's own corpus (or the stdlib source),
  not Paul Graham's essays; sentences are split at ``.!?`` + space (no nltk) and cut to at most
  ``SENTENCE_WORDS`` words, so code-like text still gives insertion points.
- Keys and common words are pronounceable nonce words (consonant-vowel syllables), not wonderwords'
  English adjective-noun lists, which are not available offline.
- Lengths are in the run's tokens (bytes for the byte tokenizer). Every prompt of a task and length has
  exactly ``length - max_new_tokens`` tokens, pieces tokenized separately and concatenated, the last
  haystack unit cut at a token (cwe / fwe: the prompt is padded with leading space tokens, fewer than
  one list entry): one shape per task and length, so one compilation.
- ``max_new_tokens`` is the longest reference answer of the task and length, written as the answer
  (``", "``-joined), plus ``ANSWER_SLACK`` tokens, instead of RULER's fixed 128 / 30 / 120 / 50
  subword tokens (which a byte tokenizer would overrun and short lengths could not afford).
- No chat template: the prompt is plain text for a base model, ending with RULER's answer prefix.
"""

from __future__ import annotations

import dataclasses
import math
import re
import uuid
from collections.abc import Callable, Sequence

import numpy as np

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
NIAH_PREFIX = ("Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the {kind} afterwards.\n")
NIAH_QUESTION = ("\nWhat are all the special magic {kind} for {query} mentioned in the provided text? "
                 "The special magic {kind} for {query} mentioned in the provided text are")
VT_PREFIX = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = ("\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: "
               "According to the chain(s) of variable assignment in the text above, {count} variables are "
               "assigned the value {value}, they are: ")
CWE_PREFIX = ("Below is a numbered list of words. In these words, some appear more often than others. "
              "Memorize the ones that appear most often.\n")
CWE_QUESTION = ("\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words "
                "that appear most often in the list are:")
FWE_PREFIX = ("Read the following coded text and track the frequency of each coded word. Find the three most "
              "frequently appeared coded words. ")
FWE_QUESTION = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                "most frequently appeared words in the above coded text? Answer: According to the coded text "
                "above, the three most frequently appeared words are:")
RULER_DEPTHS = tuple(float(d) / 100 for d in np.round(np.linspace(0, 100, num=40)).astype(int))
SENTENCE_WORDS = 50
ANSWER_SLACK = 8
VT_HOPS = 4
CWE_COMMON = 10
FWE_ALPHA = 2.0  # RULER's default; zeta(2) = pi^2 / 6
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"


@dataclasses.dataclass(frozen=True)
class RulerExample:
    """One prompt: ``prompt`` int32 ``[length - max_new_tokens]`` (opening token first), its references."""

    task: str
    length: int
    depth: float | None
    prompt: np.ndarray
    references: tuple[str, ...]
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class NiahSpec:
    haystack: str  # noise | essay | needle
    key_type: str  # words | uuids
    value_type: str  # numbers | uuids
    keys: int
    values: int
    queries: int


NIAH = {
    "niah_single_1": NiahSpec("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": NiahSpec("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": NiahSpec("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": NiahSpec("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": NiahSpec("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": NiahSpec("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": NiahSpec("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": NiahSpec("essay", "words", "numbers", 4, 1, 4),
}
TASKS = (*NIAH, "vt", "cwe", "fwe")
DEPTH_TASKS = (*NIAH, "vt")  # tasks whose prompts have a needle depth


class _Tokens:
    """Encoding with a cache of repeated pieces (noise lines, template parts)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, text: str) -> np.ndarray:
        ids = self._cache.get(text)
        if ids is None:
            ids = np.asarray(self.tokenizer.encode(text), np.int32)
            if len(text) < 200:
                self._cache[text] = ids
        return ids


def nonce_word(rng: np.random.Generator, syllables: int = 3) -> str:
    return "".join(_CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
                   for _ in range(syllables))


def _draw(kind: str, rng: np.random.Generator) -> str:
    if kind == "numbers":
        return str(int(rng.integers(10**6, 10**7)))
    if kind == "uuids":
        return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "little"), version=4))
    return f"{nonce_word(rng)}-{nonce_word(rng, 2)}"  # words: an adjective-noun-like pair


def essay_sentences(texts: Sequence[str]) -> list[str]:
    """Held-out text as sentences (whitespace collapsed, split after ``.!?``), each at most SENTENCE_WORDS words."""
    sentences = []
    for text in texts:
        for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text).strip()):
            words = sentence.split(" ")
            sentences += [" ".join(words[i:i + SENTENCE_WORDS]) for i in range(0, len(words), SENTENCE_WORDS)
                          if words[i:i + SENTENCE_WORDS] != [""]]
    return sentences


def _fill(units: Callable[[int], str], budget: int, encode: _Tokens) -> list[np.ndarray]:
    """Units ``units(0), units(1), ...`` tokenized until ``budget`` tokens, the last one cut to fit exactly."""
    pieces, total, index = [], 0, 0
    while total < budget:
        ids = encode(units(index))
        if ids.size == 0:
            raise ValueError("a haystack unit encodes to no tokens")
        pieces.append(ids[:budget - total])
        total += pieces[-1].size
        index += 1
    return pieces


def _insert(haystack: list[np.ndarray], needles: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
    """``haystack`` with each ``(unit index, tokens)`` placed before that unit (stable for equal indices)."""
    out, order = [], sorted(range(len(needles)), key=lambda i: needles[i][0])
    cursor = 0
    for i in order:
        at, ids = needles[i]
        out += haystack[cursor:at]
        out.append(ids)
        cursor = max(cursor, at)
    return out + haystack[cursor:]


def _haystack_units(kind: str, rng, sentences: Sequence[str], distractor: Callable[[], str]):
    """``index -> unit text`` of a haystack (module docstring), starting at a random sentence for ``essay``."""
    if kind == "noise":
        return lambda i: "\n" + NOISE
    if kind == "needle":
        lines: dict[int, str] = {}
        return lambda i: lines.setdefault(i, "\n" + distractor())
    if not sentences:
        raise ValueError("the essay haystack needs held-out text; none was given")
    start = int(rng.integers(len(sentences)))
    return lambda i: " " + sentences[(start + i) % len(sentences)]


def _query_words(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


def _singular(text: str) -> str:
    """RULER's rewrite of the template when one value is asked."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


def _niah_draw(spec: NiahSpec, rng) -> dict:
    keys = []
    while len(keys) < spec.keys:
        key = _draw(spec.key_type, rng)
        keys += [key] if key not in keys else []
    values = [[_draw(spec.value_type, rng) for _ in range(spec.values)] for _ in keys]
    asked = sorted(rng.choice(spec.keys, size=spec.queries, replace=False).tolist())
    asked = [int(i) for i in rng.permutation(asked)]
    return {"keys": keys, "values": values, "asked": asked,
            "references": tuple(v for i in asked for v in values[i])}


def _niah_build(spec: NiahSpec, draw: dict, depth: float, budget: int, encode: _Tokens, rng, sentences):
    kind = spec.value_type
    keys, values, asked = draw["keys"], draw["values"], draw["asked"]
    single = spec.queries * spec.values == 1
    shown_kind = kind[:-1] if single else kind
    prefix, question = NIAH_PREFIX.format(kind=shown_kind), NIAH_QUESTION.format(
        kind=shown_kind, query=_query_words([keys[i] for i in asked]))
    if single:
        prefix, question = _singular(prefix), _singular(question)
    separator = "\n" if spec.haystack in ("noise", "needle") else " "
    needles = [(k, v, separator + NEEDLE.format(kind=kind, key=keys[k], value=v))
               for k in range(len(keys)) for v in values[k]]
    first = (asked[0], values[asked[0]][0])
    needle_ids = [encode(text) for _, _, text in needles]
    fixed = 1 + encode(prefix).size + encode(question).size + sum(ids.size for ids in needle_ids)
    taken = set(draw["references"]) | set(keys)
    distractor = _distractor(spec, rng, taken)
    haystack = _fill(_haystack_units(spec.haystack, rng, sentences, distractor), budget - fixed, encode)
    other_depths = rng.choice(len(RULER_DEPTHS), size=len(needles), replace=len(needles) > len(RULER_DEPTHS))
    placed = []
    for (key, value, _), ids, other in zip(needles, needle_ids, other_depths):
        at_depth = depth if (key, value) == first else RULER_DEPTHS[int(other)]
        placed.append((int(len(haystack) * at_depth), ids))
    return _frame(encode, prefix, _insert(haystack, placed), question)


def _niah_prompt(spec: NiahSpec, draw: dict, depth: float, budget: int, encode: _Tokens, rng, sentences):
    """``_niah_build``, rebuilt on another stretch of haystack while a value also occurs in the haystack."""
    for _ in range(16):
        prompt = _niah_build(spec, draw, depth, budget, encode, rng, sentences)
        text = encode.tokenizer.decode(prompt)
        if all(text.count(value) == 1 for value in draw["references"]):
            return prompt
    raise ValueError(f"a needle value occurs in the haystack text itself in 16 tries: {draw['references']}")


def _distractor(spec: NiahSpec, rng, taken: set) -> Callable[[], str]:
    def make() -> str:
        while True:
            key, value = _draw(spec.key_type, rng), _draw(spec.value_type, rng)
            if key not in taken and value not in taken:
                return NEEDLE.format(kind=spec.value_type, key=key, value=value)
    return make


def _frame(encode: _Tokens, prefix: str, body: list[np.ndarray], question: str, pad: int = 0) -> np.ndarray:
    opening, _ = encode.tokenizer.document_ids()
    space = encode(" ")
    return np.concatenate([[opening], *([space] * pad), encode(prefix), *body, encode(question)]).astype(np.int32)


def _variables(rng, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(chr(ord("A") + int(c)) for c in rng.integers(26, size=5))
        names += [name] if name not in names else []
    return names


def _vt_draw(rng) -> dict:
    names = _variables(rng, 2 * (VT_HOPS + 1))
    value, example_value = (str(int(v)) for v in rng.choice(np.arange(10000, 100000), size=2, replace=False))
    return {"names": names[:VT_HOPS + 1], "value": value, "example_names": names[VT_HOPS + 1:],
            "example_value": example_value, "references": tuple(names[:VT_HOPS + 1])}


def _chain(names: Sequence[str], value: str) -> list[str]:
    return [f"\nVAR {names[0]} = {value}"] + [f"\nVAR {b} = VAR {a} " for a, b in zip(names, names[1:])]


def _vt_example(draw: dict) -> str:
    """RULER's in-context example: the task on five noise lines, answered."""
    lines = ["\n" + NOISE] * 5
    for offset, line in zip((0, 1, 2, 3, 4), _chain(draw["example_names"], draw["example_value"])):
        lines.insert(offset * 2, line)
    question = VT_QUESTION.format(value=draw["example_value"], count=VT_HOPS + 1)
    return VT_PREFIX + "".join(lines).lstrip("\n") + question + " ".join(draw["example_names"]) + "\n"


def _vt_build(draw: dict, depth: float, budget: int, encode: _Tokens, rng) -> np.ndarray:
    prefix = _vt_example(draw) + VT_PREFIX
    question = VT_QUESTION.format(value=draw["value"], count=VT_HOPS + 1)
    chain = [encode(line) for line in _chain(draw["names"], draw["value"])]
    fixed = 1 + encode(prefix).size + encode(question).size + sum(ids.size for ids in chain)
    haystack = _fill(lambda i: "\n" + NOISE, budget - fixed, encode)
    start = int(len(haystack) * depth)
    later = sorted(rng.integers(start, len(haystack) + 1, size=len(chain) - 1).tolist())
    return _frame(encode, prefix, _insert(haystack, list(zip([start, *later], chain))), question)


def _numbered(words: Sequence[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def _cwe_list(rng, words: list[str], count: int, common_repeats: int, rare_repeats: int) -> tuple[str, list[str]]:
    chosen = words[:count]
    common, rare = chosen[:CWE_COMMON], chosen[CWE_COMMON:]
    listed = common * common_repeats + rare * rare_repeats
    return _numbered([listed[i] for i in rng.permutation(len(listed))]), common


def _unique_words(rng, count: int) -> list[str]:
    words: list[str] = []
    seen = set()
    while len(words) < count:
        word = nonce_word(rng)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _largest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    best = None
    while low <= high:
        middle = (low + high) // 2
        if fits(middle):
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best


def _cwe_draw(rng, length: int) -> dict:
    repeats = (6, 1) if length < 4096 else (30, 3)
    example_repeats = (3, 1, 20) if length < 4096 else (10, 3, 40)
    pool = _unique_words(rng, max(length // 2, 64))
    example_rng = np.random.default_rng(rng.integers(2**32))
    example_list, example_answer = _cwe_list(example_rng, _unique_words(example_rng, example_repeats[2]),
                                             example_repeats[2], *example_repeats[:2])
    example = CWE_PREFIX + example_list + CWE_QUESTION + " " + _numbered(example_answer) + "\n"
    return {"pool": pool, "repeats": repeats, "example": example, "list_seed": int(rng.integers(2**32)),
            "references": tuple(pool[:CWE_COMMON])}


def _list_prompt(encode: _Tokens, budget: int, prefix: str, question: str, context_of: Callable[[int], str],
                 low: int, high: int) -> np.ndarray:
    fixed = 1 + encode(prefix).size + encode(question).size

    def fits(count: int) -> bool:
        return fixed + encode(context_of(count)).size <= budget

    count = _largest_fitting(low, high, fits)
    if count is None:
        smallest = fixed + encode(context_of(low)).size
        raise ValueError(f"the template and the smallest list need {smallest} prompt tokens, {smallest - budget} "
                         f"more than this length leaves; use a longer length")
    body = encode(context_of(count))
    return _frame(encode, prefix, [body], question, pad=(budget - fixed - body.size) // max(encode(" ").size, 1))


def _cwe_build(draw: dict, budget: int, encode: _Tokens) -> np.ndarray:
    def context_of(count: int) -> str:
        return _cwe_list(np.random.default_rng(draw["list_seed"]), draw["pool"], count, *draw["repeats"])[0]
    return _list_prompt(encode, budget, draw["example"] + CWE_PREFIX, CWE_QUESTION, context_of,
                        CWE_COMMON + 1, len(draw["pool"]))


def _fwe_vocabulary(rng, size: int) -> list[str]:
    vocabulary = sorted({"".join(chr(ord("a") + int(c)) for c in rng.integers(26, size=6)) for _ in range(size)})
    vocabulary = [vocabulary[i] for i in rng.permutation(len(vocabulary))]
    vocabulary[0] = "..."  # the top-ranked word is noise
    return vocabulary


def _fwe_draw(rng, length: int) -> dict:
    vocabulary = _fwe_vocabulary(rng, max(length // 50, 5))
    return {"vocabulary": vocabulary, "list_seed": int(rng.integers(2**32)), "references": tuple(vocabulary[1:4])}


def _fwe_build(draw: dict, budget: int, encode: _Tokens) -> np.ndarray:
    vocabulary = draw["vocabulary"]
    ranks = np.arange(1, len(vocabulary) + 1)
    zeta = math.pi ** 2 / 6

    def context_of(count: int) -> str:
        counts = (count * ranks ** -FWE_ALPHA / zeta).astype(int)
        words = [w for w, c in zip(vocabulary, counts) for _ in range(c)]
        order = np.random.default_rng(draw["list_seed"]).permutation(len(words))
        return " ".join(words[i] for i in order)
    low = int(math.ceil(4 ** FWE_ALPHA * zeta))  # rank 4 occurs at least once
    return _list_prompt(encode, budget, FWE_PREFIX, FWE_QUESTION, context_of, low, max(budget, low))


def answer_text(references: Sequence[str]) -> str:
    """The references written as an answer: what ``max_new_tokens`` must leave room for."""
    return " " + ", ".join(references) + "."


def _task_seed(seed: int, task: str, length: int) -> np.random.Generator:
    return np.random.default_rng([seed, TASKS.index(task), length])


def ruler_examples(task: str, tokenizer, *, length: int, depths: Sequence[float], per_depth: int, seed: int,
                   sentences: Sequence[str] = ()) -> list[RulerExample]:
    """``per_depth`` examples at each depth (cwe / fwe: ``per_depth * len(depths)`` without depth) of ``task``.

    Deterministic in ``(seed, task, length)`` and the tokenizer; ``sentences`` (``essay_sentences``) feed the
    essay haystack. Every prompt has ``length - max_new_tokens`` tokens (module docstring).
    """
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {task!r}; tasks: {', '.join(TASKS)}")
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an int >= 2, got {length!r}")
    if not depths or any(not 0.0 <= float(d) <= 1.0 for d in depths):
        raise ValueError(f"depths must be fractions in [0, 1], got {list(depths)}")
    if not isinstance(per_depth, int) or per_depth < 1:
        raise ValueError(f"per_depth must be an int >= 1, got {per_depth!r}")
    rng, encode = _task_seed(seed, task, length), _Tokens(tokenizer)
    slots = [float(d) for d in depths for _ in range(per_depth)]
    if task in NIAH:
        draws = [_niah_draw(NIAH[task], rng) for _ in slots]
    elif task == "vt":
        draws = [_vt_draw(rng) for _ in slots]
    elif task == "cwe":
        draws = [_cwe_draw(rng, length) for _ in slots]
    else:
        draws = [_fwe_draw(rng, length) for _ in slots]
    max_new = max(encode(answer_text(d["references"])).size for d in draws) + ANSWER_SLACK
    budget = length - max_new
    examples = []
    for depth, draw in zip(slots, draws):
        try:
            if task in NIAH:
                prompt = _niah_prompt(NIAH[task], draw, depth, budget, encode, rng, sentences)
            elif task == "vt":
                prompt = _vt_build(draw, depth, budget, encode, rng)
            elif task == "cwe":
                prompt = _cwe_build(draw, budget, encode)
            else:
                prompt = _fwe_build(draw, budget, encode)
        except ValueError as error:
            raise ValueError(f"{task} at length {length}: {error}") from None
        if prompt.size != budget:
            raise ValueError(f"{task} at length {length}: the template, needles and answer need "
                             f"{prompt.size + max_new} tokens; use a longer length")
        examples.append(RulerExample(task, length, depth if task in DEPTH_TASKS else None, prompt,
                                     tuple(draw["references"]), max_new))
    return examples
