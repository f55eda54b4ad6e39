"""lm-evaluation-harness runs an export as any Hugging Face model directory, and scores it as the JAX model does.

A tiny random causal export (``[swa, gated_deltanet, mamba2]``, the byte-level tokenizer) is evaluated by
``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True`` (lm_eval in an environment of
its own, ``package_environments``) on two local tasks, at ``--batch_size`` 1 and 4, offline:

* ``seqmodels_choice`` (``multiple_choice``, ``acc``): a context and four continuations of different
  lengths. The JAX model's log-likelihoods of every continuation are computed here; each document's
  answer is the JAX model's choice for half of the documents and another continuation for the rest, so the
  expected accuracy is known before lm_eval runs.
* ``seqmodels_generate`` (``generate_until``, ``exact_match``): prompts of different lengths (a batch of 4
  is left-padded), greedy until a newline or 6 tokens. The target is the JAX model's greedy continuation
  for half of the prompts and a wrong string for the rest.

Asserted: lm_eval's scores are the expected ones at both batch sizes, its per-document log-likelihoods equal
the JAX model's within what the export's logit tolerance allows, and its generations are the JAX model's.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from export_parity import BASE_CONFIG, LOGIT_TOLERANCE, jax_logits, jax_model, random_params, tiny_config
from package_environments import package_environment, run_checked

pytestmark = pytest.mark.xdist_group("lm_eval")  # one worker builds the module's export and lm_eval's results once

LM_EVAL = "lm_eval[hf]==0.4.13"
NUM_CHOICE_DOCS, NUM_GENERATE_DOCS, MAX_NEW_TOKENS, WIDTH = 8, 8, 6, 64
CLEAR_MARGIN = 0.05  # a choice decides the expected score only when it wins by this much in log-likelihood


def _lm_eval_bin():
    return package_environment("lm_eval-0.4.13", LM_EVAL, "__import__('lm_eval').__version__", "0.4.13")


def _log_likelihoods(model, rows: list[list[int]], starts: list[int]) -> list[float]:
    """Each row's summed log-probability of its tokens from ``starts[i]`` on, under the JAX model
    (rows right-padded to ``WIDTH``: a causal model's earlier positions never see the padding)."""
    batch = np.zeros((len(rows), WIDTH), np.int32)
    for i, row in enumerate(rows):
        batch[i, :len(row)] = row
    logits = np.asarray(jax_logits(model, jnp.asarray(batch)), np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return [float(sum(log_probs[i, t - 1, row[t]] for t in range(start, len(row))))
            for i, (row, start) in enumerate(zip(rows, starts))]


def _greedy(model, prompt: list[int], eos_id: int) -> list[int]:
    """The JAX model's greedy continuation of ``prompt``: up to ``MAX_NEW_TOKENS``, stopping at EOS."""
    tokens = list(prompt)
    for _ in range(MAX_NEW_TOKENS):
        batch = np.zeros((1, WIDTH), np.int32)
        batch[0, :len(tokens)] = tokens
        token = int(np.asarray(jax_logits(model, jnp.asarray(batch)))[0, len(tokens) - 1].argmax())
        if token == eos_id:
            break
        tokens.append(token)
    return tokens[len(prompt):]


def _task_files(directory, choice_docs, generate_docs):
    for name, docs in (("choice", choice_docs), ("generate", generate_docs)):
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    data = {name: {"test": str(directory / f"{name}.jsonl")} for name in ("choice", "generate")}
    (directory / "seqmodels_choice.yaml").write_text(f"""task: seqmodels_choice
dataset_path: json
dataset_kwargs:
  data_files: {json.dumps(data["choice"])}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
""")
    (directory / "seqmodels_generate.yaml").write_text(f"""task: seqmodels_generate
dataset_path: json
dataset_kwargs:
  data_files: {json.dumps(data["generate"])}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {MAX_NEW_TOKENS}
  do_sample: false
metric_list:
  - metric: exact_match
""")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """The tasks, what the JAX model expects of them, and lm_eval's results at batch sizes 1 and 4."""
    from seqmodels.data.tokenizers import ByteTokenizer
    from seqmodels.hf.export import export_model
    tokenizer = ByteTokenizer()
    config = dataclasses.replace(tiny_config(BASE_CONFIG), vocab_size=258, mixers=("swa", "gated_deltanet", "mamba2"))
    params = random_params(config)
    root = tmp_path_factory.mktemp("lm_eval")
    directory = export_model(config, params, root / "hf", tokenizer="byte")
    model = jax_model(config, params)
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "seven", "blue", "quiet", "north"]

    def text(count):
        return " ".join(rng.choice(words, size=count))

    choice_docs, expected_choice = [], []
    while len(choice_docs) < NUM_CHOICE_DOCS:
        context, choices = text(rng.integers(2, 6)), [text(n) for n in (1, 2, 3, 2)]
        prefix = [tokenizer.bos_id, *tokenizer.encode(context)]
        rows = [prefix + list(tokenizer.encode(" " + choice)) for choice in choices]
        scores = _log_likelihoods(model, rows, [len(prefix)] * len(rows))
        best, runner_up = sorted(scores, reverse=True)[:2]
        if best - runner_up < CLEAR_MARGIN:
            continue  # too close to call at the export's tolerance
        chosen = int(np.argmax(scores))
        right = len(choice_docs) % 2 == 0
        answer = chosen if right else (chosen + 1) % len(choices)
        choice_docs.append({"context": context, "choices": choices, "answer": answer})
        expected_choice.append({"scores": scores, "correct": right})
    generate_docs, expected_generate = [], []
    for i in range(NUM_GENERATE_DOCS):
        prompt = text(1 + i % 4)  # 4 lengths: a batch of 4 is left-padded
        continuation = tokenizer.decode(_greedy(model, [tokenizer.bos_id, *tokenizer.encode(prompt)],
                                                tokenizer.eos_id)).split("\n")[0]
        right = i % 2 == 0
        generate_docs.append({"prompt": prompt, "target": continuation if right else continuation + "#wrong"})
        expected_generate.append({"generated": continuation, "correct": right})
    tasks = root / "tasks"
    tasks.mkdir()
    _task_files(tasks, choice_docs, generate_docs)

    lm_eval = _lm_eval_bin() / "lm_eval"
    environment = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "HF_HOME": str(root / "hf_home"), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    results = {}
    for batch_size in (1, 4):
        out = root / f"out_{batch_size}"
        run_checked([str(lm_eval), "--model", "hf", "--model_args",
                     f"pretrained={directory},trust_remote_code=True,add_bos_token=True,dtype=float32",
                     "--tasks", "seqmodels_choice,seqmodels_generate", "--include_path", str(tasks),
                     "--batch_size", str(batch_size), "--device", "cpu", "--output_path", str(out),
                     "--log_samples"], f"lm_eval at batch size {batch_size}", env=environment)
        (summary,) = out.rglob("results_*.json")
        samples = {name: [json.loads(line) for line in next(out.rglob(f"samples_{name}_*.jsonl")).read_text()
                          .splitlines()] for name in ("seqmodels_choice", "seqmodels_generate")}
        results[batch_size] = {"scores": json.loads(summary.read_text())["results"], "samples": samples}
    return {"choice": expected_choice, "generate": expected_generate, "results": results,
            "choice_docs": choice_docs}


def _by_doc(samples):
    return sorted(samples, key=lambda sample: sample["doc_id"])


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 4])
def test_lm_eval_scores_an_export_as_the_jax_model_does(evaluated, batch_size):
    scores = evaluated["results"][batch_size]["scores"]
    expected_acc = np.mean([doc["correct"] for doc in evaluated["choice"]])
    expected_match = np.mean([doc["correct"] for doc in evaluated["generate"]])
    assert scores["seqmodels_choice"]["acc,none"] == pytest.approx(expected_acc), scores
    assert scores["seqmodels_generate"]["exact_match,none"] == pytest.approx(expected_match), scores

    samples = evaluated["results"][batch_size]["samples"]
    for sample, expected, doc in zip(_by_doc(samples["seqmodels_choice"]), evaluated["choice"],
                                     evaluated["choice_docs"]):
        log_likelihoods = [float(response[0][0]) for response in sample["resps"]]  # logged as text
        for choice, got, want in zip(doc["choices"], log_likelihoods, expected["scores"]):
            # |log_softmax error| <= 2 x the logits' max abs error, per continuation token
            assert abs(got - want) <= 2 * LOGIT_TOLERANCE * len((" " + choice).encode()), (doc, got, want)
    for sample, expected in zip(_by_doc(samples["seqmodels_generate"]), evaluated["generate"]):
        assert sample["filtered_resps"][0] == expected["generated"], (sample, expected)


@pytest.mark.slow
def test_lm_eval_scores_the_same_at_batch_sizes_1_and_4(evaluated):
    one, four = (evaluated["results"][size]["scores"] for size in (1, 4))
    for task, metric in (("seqmodels_choice", "acc,none"), ("seqmodels_generate", "exact_match,none")):
        assert one[task][metric] == four[task][metric], (task, one[task], four[task])
