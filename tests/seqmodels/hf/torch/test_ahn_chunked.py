"""An exported AHN student's compressors run chunk-parallel for a call of many tokens and give the recurrent logits.

Each compressor (``configs/ahn_*.yaml`` at the parity size: window 8, 2 sinks) over 37 tokens in chunks of 16 (not
a multiple), with one row left-padded: the chunked logits equal the token-by-token ones, and a chunked prefill of
29 tokens then 8 decoded one at a time gives them too. The compressors' read-out maps are drawn non-zero
(``export_parity.random_params``) and the logits are checked to move with them, so a compressor that the chunk form
got wrong changes the logits. Tolerance as ``test_chunked_forms``: 1e-5 max abs on O(1) float32 logits.
"""

import numpy as np
import pytest
from export_parity import ROOT, load_torch, random_params, tiny_config, without_compressors
from test_chunked_forms import CHUNK, LENGTH, TOLERANCE

COMPRESSORS = ("gated_deltanet", "deltanet", "mamba2")


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_the_ahn_compressors_chunked_give_the_recurrent_logits_and_decode_on_from_a_chunked_prefill(tmp_path,
                                                                                                  compressor):
    import torch

    from seqmodels.hf.export import export_model
    from seqmodels.hf.torch.chunked import set_scan_form
    from seqmodels.hf.torch.lm import CACHE_FIELD
    config = tiny_config(ROOT / "configs" / f"ahn_{compressor}.yaml")
    params = random_params(config)
    model = load_torch(export_model(config, params, tmp_path / "hf"))
    window_only = load_torch(export_model(config, without_compressors(params), tmp_path / "window_only"))
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, config.vocab_size, size=(2, LENGTH)))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        assert set_scan_form(model, "recurrent") == len(config.mixers)  # one compressor a layer
        recurrent = model(ids, attention_mask=mask).logits
        set_scan_form(model, "auto", chunk_size=CHUNK)
        chunked = model(ids, attention_mask=mask).logits
        prefill = 29
        output = model(ids[:, :prefill], attention_mask=mask[:, :prefill], use_cache=True)
        steps = [output.logits]
        for t in range(prefill, LENGTH):
            output = model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], use_cache=True,
                           **{CACHE_FIELD: getattr(output, CACHE_FIELD)})
            steps.append(output.logits)
        decoded = torch.cat(steps, dim=1)
        without = window_only(ids, attention_mask=mask).logits
    assert float(recurrent.abs().max()) > 1.0  # the tolerance is absolute on O(1) logits
    assert float((recurrent - without).abs().max()) > 1e-2  # the compressors move the logits
    assert float((chunked - recurrent).abs().max()) < TOLERANCE
    assert float((decoded - recurrent).abs().max()) < TOLERANCE
