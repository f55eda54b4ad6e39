"""An exported ``[swa, gated_deltanet]`` model fine-tunes in PyTorch and comes back into JAX.

20 AdamW steps (lr 3e-3) on one batch of 4 rows of 48 tokens, a short pattern repeated (learnable), through the
chunk-parallel Gated DeltaNet (chunks of 16, so 48 tokens are three): the loss falls by at least 2 nats from the
exported model's (the pattern's ids are uniform under the random export: ~log 97 = 4.6 nats). ``save_pretrained``
then ``seqmodels.hf.load_pretrained``: the JAX model's float32 logits are within 1e-4 (max abs, the parity
tolerance of ``export_parity``) of PyTorch's fine-tuned logits.
"""

import dataclasses

import numpy as np
from export_parity import BASE_CONFIG, LOGIT_TOLERANCE, jax_logits, load_torch, random_params, tiny_config

STEPS, ROWS, LENGTH, PATTERN = 20, 4, 48, 6
LOSS_DROP = 2.0  # nats, first step's loss less the last's


def test_an_export_fine_tunes_in_pytorch_and_loads_back_in_jax_with_equal_logits(tmp_path):
    import torch

    from seqmodels.hf import load_pretrained
    from seqmodels.hf.export import export_model
    from seqmodels.hf.torch.chunked import set_scan_form
    config = dataclasses.replace(tiny_config(BASE_CONFIG), mixers=("swa", "gated_deltanet"))
    model = load_torch(export_model(config, random_params(config), tmp_path / "export"))
    assert set_scan_form(model, "auto", chunk_size=16) == 1
    rng = np.random.default_rng(0)
    patterns = rng.integers(3, config.vocab_size, size=(ROWS, PATTERN))
    ids = torch.as_tensor(np.tile(patterns, LENGTH // PATTERN))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for _ in range(STEPS):
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[0] - losses[-1] > LOSS_DROP, losses
    model.eval()
    model.save_pretrained(tmp_path / "tuned")
    with torch.no_grad():
        tuned = model(ids).logits.numpy()
    exported = load_torch(tmp_path / "export")
    with torch.no_grad():
        assert float(np.abs(exported(ids).logits.numpy() - tuned).max()) > 0.1  # the weights did change
    jax_model = load_pretrained(tmp_path / "tuned")
    difference = float(np.abs(np.asarray(jax_logits(jax_model, ids.numpy())) - tuned).max())
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, JAX vs PyTorch max abs {difference:.2e}")
    assert float(np.abs(tuned).max()) > 1.0  # the tolerance is absolute on O(1) logits
    assert difference < LOGIT_TOLERANCE, difference
