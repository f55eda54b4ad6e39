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
  ``ruler_pieces.SENTENCE_WORDS`` words, so code-like text still gives insertion points.
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
import uuid
from collections.abc import Callable, Sequence

import numpy as np

from seqmodels.data.ruler_aggregation import cwe_build, cwe_draw, fwe_build, fwe_draw, vt_build, vt_draw
from seqmodels.data.ruler_pieces import (NOISE, RULER_DEPTHS, TokenCache, essay_from,  # noqa: F401 (re-exported)
                                         essay_sentences, fill, frame, insert, nonce_word)

NEEDLE = "One of the special magic {kind} for {key} is: {value}."
NIAH_PREFIX = ("Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the {kind} afterwards.\n")
NIAH_QUESTION = ("\nWhat are all the special magic {kind} for {query} mentioned in the provided text? "
                 "The special magic {kind} for {query} mentioned in the provided text are")
ANSWER_SLACK = 8


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


def needs_essay(tasks) -> bool:
    """Whether any of ``tasks`` has the essay haystack (its prompts need ``sentences`` of text)."""
    return any(task in NIAH and NIAH[task].haystack == "essay" for task in tasks)


def _draw(kind: str, rng: np.random.Generator) -> str:
    if kind == "numbers":
        return str(int(rng.integers(10**6, 10**7)))
    if kind == "uuids":
        return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "little"), version=4))
    return f"{nonce_word(rng)}-{nonce_word(rng, 2)}"  # words: an adjective-noun-like pair


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


def _niah_build(spec: NiahSpec, draw: dict, depth: float, budget: int, encode: TokenCache, rng, sentences):
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
    haystack = fill(_haystack_units(spec.haystack, rng, sentences, distractor), budget - fixed, encode)
    other_depths = rng.choice(len(RULER_DEPTHS), size=len(needles), replace=len(needles) > len(RULER_DEPTHS))
    placed = []
    for (key, value, _), ids, other in zip(needles, needle_ids, other_depths):
        at_depth = depth if (key, value) == first else RULER_DEPTHS[int(other)]
        placed.append((int(len(haystack) * at_depth), ids))
    return frame(encode, prefix, insert(haystack, placed), question)


def _niah_prompt(spec: NiahSpec, draw: dict, depth: float, budget: int, encode: TokenCache, rng, sentences):
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
    rng, encode = _task_seed(seed, task, length), TokenCache(tokenizer)
    slots = [float(d) for d in depths for _ in range(per_depth)]
    if task in NIAH:
        draws = [_niah_draw(NIAH[task], rng) for _ in slots]
    elif task == "vt":
        draws = [vt_draw(rng) for _ in slots]
    elif task == "cwe":
        draws = [cwe_draw(rng, length) for _ in slots]
    else:
        draws = [fwe_draw(rng, length) for _ in slots]
    max_new = max(encode(answer_text(d["references"])).size for d in draws) + ANSWER_SLACK
    budget = length - max_new
    examples = []
    for depth, draw in zip(slots, draws):
        try:
            if task in NIAH:
                prompt = _niah_prompt(NIAH[task], draw, depth, budget, encode, rng, sentences)
            elif task == "vt":
                prompt = vt_build(draw, depth, budget, encode, rng)
            elif task == "cwe":
                prompt = cwe_build(draw, budget, encode)
            else:
                prompt = fwe_build(draw, budget, encode)
        except ValueError as error:
            raise ValueError(f"{task} at length {length}: {error}") from None
        if prompt.size != budget:
            raise ValueError(f"{task} at length {length}: the template, needles and answer need "
                             f"{prompt.size + max_new} tokens; use a longer length")
        examples.append(RulerExample(task, length, depth if task in DEPTH_TASKS else None, prompt,
                                     tuple(draw["references"]), max_new))
    return examples
