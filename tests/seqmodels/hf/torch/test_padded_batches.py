"""Padded batches through every exported mixer: each row of a left- or right-padded batch (random ids at the
padding) gives the logits and greedy tokens of the row run alone.

Two layers of each mixer in the twins' registry (``seqmodels.hf.torch.mixers.MIXERS``, at the base config's
settings with the windows shrunk to 8 + 2 sinks, so 24 tokens cross them) and the AHN students; rows of
24, 17 and 9 tokens. Tolerance 1e-5 (max abs, float32, logits O(1)): the same arithmetic in another batch
layout, so only summation order differs. (``attention`` exports as transformers' own ``LlamaForCausalLM``,
whose ``generate`` continues the last column: it is measured on right padding in ``forward`` only.)
"""

import dataclasses

import numpy as np
import pytest
from export_parity import BASE_CONFIG, CONFIGS, load_torch, random_params, tiny_config

from seqmodels.hf.torch.mixers import MIXERS

LENGTHS = (24, 17, 9)
NEW_TOKENS = 8
TOLERANCE = 1e-5
SLOW = {"atlas", "atlas_mag", "atlas_mal"}  # the Newton-Schulz memories: over ~20 s here


def _cases():
    cases = [pytest.param(dataclasses.replace(tiny_config(BASE_CONFIG), mixers=(name, name)), id=name,
                          marks=(pytest.mark.slow,) if name in SLOW else ()) for name in sorted(MIXERS)]
    for path in CONFIGS:
        if path.stem.startswith("ahn_"):
            cases.append(pytest.param(tiny_config(path), id=path.stem))
    return cases


def _padded(rows, side: str, rng, vocab: int):
    """``(ids [B, W], attention_mask [B, W])`` of ``rows`` padded on ``side`` with random ids."""
    import torch
    width = max(len(row) for row in rows)
    ids = torch.as_tensor(rng.integers(0, vocab, size=(len(rows), width)))
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        columns = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, columns], mask[i, columns] = row, 1
    return ids, mask, width


@pytest.mark.parametrize("config", _cases())
def test_padded_rows_give_each_row_alone_logits_and_greedy_tokens(tmp_path, config):
    import torch

    from seqmodels.hf.export import export_model
    model = load_torch(export_model(config, random_params(config), tmp_path / "hf"))
    rng = np.random.default_rng(0)
    rows = [torch.as_tensor(rng.integers(0, config.vocab_size, size=length)) for length in LENGTHS]
    settings = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)  # (the export names no EOS)
    with torch.no_grad():
        alone = [model(row[None]).logits[0] for row in rows]
        alone_tokens = [model.generate(row[None], attention_mask=torch.ones_like(row[None]), **settings)[0, len(row):]
                        for row in rows]
        assert float(max(logits.abs().max() for logits in alone)) > 1.0  # the tolerance is absolute on O(1) logits
        for side in ("left", "right"):
            ids, mask, width = _padded(rows, side, rng, config.vocab_size)
            logits = model(ids, attention_mask=mask).logits
            for i, row in enumerate(rows):
                real = mask[i].bool()
                difference = float((logits[i, real] - alone[i]).abs().max())
                assert difference < TOLERANCE, (side, i, difference)
            if side == "right" and type(model).__name__ == "LlamaForCausalLM":
                continue  # transformers' own Llama (the attention export) generates from left padding only
            if side == "right":  # a padded position repeats the last real token's logits (the next token's)
                last = torch.tensor([len(row) - 1 for row in rows])
                torch.testing.assert_close(logits[:, -1], logits[torch.arange(len(rows)), last], rtol=0, atol=0)
            generated = model.generate(ids, attention_mask=mask, **settings)[:, width:]
            for i in range(len(rows)):
                assert torch.equal(generated[i], alone_tokens[i]), (side, i, generated[i], alone_tokens[i])


def test_a_mask_of_the_wrong_shape_is_refused_naming_the_expected_one(tmp_path):
    import torch

    from seqmodels.hf.export import export_model
    config = dataclasses.replace(tiny_config(BASE_CONFIG), mixers=("swa",))
    model = load_torch(export_model(config, random_params(config), tmp_path / "hf"))
    with pytest.raises(ValueError, match=r"attention_mask must be \[batch, columns\] with batch 2 and at least 5"):
        model(torch.zeros((2, 5), dtype=torch.long), attention_mask=torch.ones((2, 3), dtype=torch.long))


def test_the_looped_classifier_refuses_padding_and_says_why(tmp_path):
    """Its layout ``[BOS] w [PAD] x P(N) [CLS]`` and its loop count follow each row's length N."""
    import torch
    from export_parity import looped_config

    from seqmodels.hf.export import export_model
    config = looped_config("looped_cfl")
    model = load_torch(export_model(config, random_params(config), tmp_path / "hf"),
                       "AutoModelForSequenceClassification")
    ids = torch.tensor([[5, 7, 8, 2], [5, 7, 2, 0]])
    with pytest.raises(ValueError, match="the looped model takes plain rows only"):
        model(ids, attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]))
    assert model(ids[:1], attention_mask=torch.ones((1, 4), dtype=torch.long)).logits.shape == (1, 2)
