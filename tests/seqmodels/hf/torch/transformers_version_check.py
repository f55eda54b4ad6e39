"""Load an export in whatever ``transformers`` this interpreter has and measure it against the JAX model's numbers.

``python transformers_version_check.py DIR EXPECTED.npz [LOOPED_DIR LOOPED.npz]`` prints a line ``result: JSON``
(DIR: a seqmodels remote-code export or one as transformers' own ``Mamba2ForCausalLM``):
the transformers version, the class loaded, the max abs difference of the logits (whole rows and decoded
from the cache) from the expected ones, whether the greedy tokens equal the expected ones, whether a
left-padded batch generates what each row generates alone, and whether ``AutoTokenizer`` gives the
byte-level ids; with a looped export, the max abs difference of its vocabulary logits
(``AutoModelForSequenceClassification``) from the expected ones. It imports torch, transformers and numpy
only (no seqmodels, no JAX): it runs in the test's separate environments, one per transformers version
(``test_transformers_versions.py``). What differs between versions is found in the objects, never assumed from a
version number: the name of the cache in an output and in ``forward``'s arguments, and whether ``forward`` takes
the ``cache_position`` that transformers 4's ``Mamba2ForCausalLM`` needs beside a cache.
"""

from __future__ import annotations

import inspect
import json
import sys

import numpy as np

RESULT = "result: "  # the line of stdout that holds the JSON
CACHE_NAMES = ("cache", "cache_params", "past_key_values")  # in the order a forward taking several is passed it


def cache_of(output):
    """The cache an output carries, under the field name of this transformers and model (``CACHE_NAMES``)."""
    return next(output[name] for name in CACHE_NAMES if name in output)


def cache_arguments(model, output, position: int) -> dict:
    """``output``'s cache under the name ``model.forward`` takes it by, and ``cache_position`` (the position of the
    next token) where ``forward`` takes one."""
    import torch
    parameters = inspect.signature(model.forward).parameters
    arguments = {next(name for name in CACHE_NAMES if name in parameters): cache_of(output)}
    if "cache_position" in parameters:
        arguments["cache_position"] = torch.tensor([position])
    return arguments


def cached_logits(model, tokens, prompt: int):
    output = model(tokens[:, :prompt], use_cache=True)
    steps = [output.logits]
    for t in range(prompt, tokens.shape[1]):
        output = model(tokens[:, t:t + 1], use_cache=True, **cache_arguments(model, output, t))
        steps.append(output.logits)
    return np.concatenate([step.numpy() for step in steps], axis=1)


def padded_generation_matches_rows(model, tokens, new_tokens: int, pad_id: int) -> bool:
    """Left-pad rows of lengths 8, 5, 3 into one batch: its greedy tokens equal each row's generated alone."""
    import torch
    rows = [tokens[0, :8], tokens[1, :5], tokens[0, 10:13]]
    width = max(len(row) for row in rows)
    batch = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, width - len(row):], mask[i, width - len(row):] = row, 1
    settings = dict(max_new_tokens=new_tokens, do_sample=False)
    together = model.generate(batch, attention_mask=mask, **settings)[:, width:]
    alone = [model.generate(row[None], attention_mask=torch.ones_like(row[None]), **settings)[0, len(row):]
             for row in rows]
    return all(torch.equal(together[i], alone[i]) for i in range(len(rows)))


def tokenizer_ids(directory) -> dict:
    from transformers import AutoTokenizer
    # (transformers 5 reads the model's config.json first, which is remote code here: trusted as for the model)
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    texts = ["Hello, world", "naïve café ☕ \U0001f600", "<bos> stays text\n\ttabs  spaces"]
    encoded = [tokenizer(text)["input_ids"] for text in texts]
    expected = [[tokenizer.bos_token_id, *text.encode("utf-8")] for text in texts]
    decoded = [tokenizer.decode(ids, skip_special_tokens=True) for ids in encoded]
    return {"ids_equal": encoded == expected, "decoded_equal": decoded == texts, "bos_id": tokenizer.bos_token_id,
            "eos_id": tokenizer.eos_token_id, "class": type(tokenizer).__name__}


def main(directory: str, expected_path: str) -> dict:
    import torch
    import transformers
    torch.set_num_threads(1)
    expected = np.load(expected_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).eval()
    # every generation runs its whole length, as JAX's does: no EOS stop (set on the object, in any version)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, int(expected["pad_id"])
    tokens = torch.as_tensor(expected["tokens"])
    prompt, new_tokens = int(expected["prompt"]), int(expected["new_tokens"])
    with torch.no_grad():
        logits = model(tokens).logits.numpy()
        cached = cached_logits(model, tokens, prompt)
        greedy = model.generate(tokens[:, :prompt], attention_mask=torch.ones_like(tokens[:, :prompt]),
                                max_new_tokens=new_tokens, do_sample=False).numpy()
        padded = padded_generation_matches_rows(model, tokens, new_tokens, int(expected["pad_id"]))
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "architecture": type(model).__name__, "max_abs": float(np.abs(logits - expected["logits"]).max()),
            "cached_max_abs": float(np.abs(cached - expected["logits"]).max()),
            "greedy_equal": bool(np.array_equal(greedy, expected["greedy"])), "padded_generation_equal": padded,
            "tokenizer": tokenizer_ids(directory)}


def looped(directory: str, expected_path: str) -> dict:
    import torch
    import transformers
    expected = np.load(expected_path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True).eval()
    with torch.no_grad():
        output = model(torch.as_tensor(expected["tokens"]))
    return {"architecture": type(model).__name__,
            "max_abs": float(np.abs(output["vocab_logits"].numpy() - expected["logits"]).max())}


if __name__ == "__main__":
    if len(sys.argv) not in (3, 5):
        sys.exit("usage: python transformers_version_check.py EXPORT_DIR EXPECTED.npz [LOOPED_DIR LOOPED.npz]")
    result = main(sys.argv[1], sys.argv[2])
    if len(sys.argv) == 5:
        result["looped"] = looped(sys.argv[3], sys.argv[4])
    print(RESULT + json.dumps(result))
