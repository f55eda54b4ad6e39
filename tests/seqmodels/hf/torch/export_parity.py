"""Parity of an export with the JAX model: tiny random models of every config, their logits and greedy tokens.

``python tests/seqmodels/hf/torch/export_parity.py`` prints the parity table of every config in
``configs/`` and ``configs/ablations/`` (markdown), as the tests measure it.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROOT = Path(__file__).resolve().parents[4]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "configs" / "ablations").glob("*.yaml"))
BASE_CONFIG = ROOT / "configs" / "atlas.yaml"  # the model the hand-made variants start from (its settings)
VOCAB, LENGTH, PROMPT, NEW_TOKENS = 97, 24, 8, 16
LOGIT_TOLERANCE = 1e-4  # float32, max abs over [B, T, vocab]; the logits are O(1) (asserted > 1)
CAUSAL_KINDS = ("lm", "ahn")  # the kinds measured by measure_lm (the looped model has its own test)
AHN_READOUT_SCALE = 0.5  # std of the AHN read-out maps in the parity models


def config_name(path: Path) -> str:
    return str(path.relative_to(ROOT / "configs").with_suffix(""))


def tiny_config(path: Path):
    """The config's model section at d_model 64, 2 layers, vocabulary 97; sliding windows (and AHN's window)
    shrunk to 8 + 2 sinks so that 24 tokens (and 16 generated) cross them; AHN's base with grouped-query
    heads (4 over 2). Only the model section is read (an AHN config's tokenizer names its base's directory)."""
    from seqmodels.config_io import model_config_from_dict, read_yaml
    model = model_config_from_dict(read_yaml(path).get("model", {}))
    swa = dataclasses.replace(model.swa, window=min(model.swa.window, 8), num_sinks=min(model.swa.num_sinks, 2))
    changes = {}
    if model.kind == "ahn":
        changes = dict(ahn=dataclasses.replace(model.ahn, window=8, sinks=2, chunk_size=16), num_heads=4,
                       attention=dataclasses.replace(model.attention, num_kv_heads=2))
    return dataclasses.replace(model, vocab_size=VOCAB, d_model=64, mixers=model.mixers[:2], max_seq_len=128,
                               scan_layers=False, swa=swa, **changes)


def random_params(config, seed: int = 0, noise: float = 0.05) -> dict:
    """The model's initial parameters with every entry perturbed (norm scales, biases and skips too); AHN's
    read-out maps (zero at initialisation, so the compressors add nothing) drawn at ``AHN_READOUT_SCALE``."""
    from seqmodels.models import build_model
    params = nnx.to_pure_dict(nnx.state(build_model(config, seed=seed), nnx.Param))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    params = jax.tree.unflatten(tree, [leaf + noise * jax.random.normal(key, leaf.shape)
                                       for leaf, key in zip(leaves, keys)])
    if config.kind == "ahn":
        keys = jax.random.split(jax.random.key(seed + 2), len(params["blocks"]))
        for key, block in zip(keys, params["blocks"].values()):
            block["ahn"]["readout"] = AHN_READOUT_SCALE * jax.random.normal(key, block["ahn"]["readout"].shape)
    return params


def without_compressors(params: dict) -> dict:
    """AHN ``params`` with every read-out map zero: the student reduces to sliding window + sinks."""
    return {**params, "blocks": {i: {**block, "ahn": {**block["ahn"], "readout": 0 * block["ahn"]["readout"]}}
                                 for i, block in params["blocks"].items()}}


def jax_model(config, params):
    from seqmodels.models import abstract_model
    return nnx.merge(abstract_model(config)[0], params)


@nnx.jit
def jax_logits(model, tokens):
    """The model's float32 logits (the LM's ``[B, T, V]``, the looped model's ``[B, V]``)."""
    output = model(tokens)
    return output[0] if isinstance(output, tuple) else output


def load_torch(directory, auto_class: str = "AutoModelForCausalLM", **kwargs):
    import torch
    import transformers
    torch.set_num_threads(1)  # the tiny models gain nothing from threads; oversubscribed cores lose 100x
    loaded = getattr(transformers, auto_class).from_pretrained(directory, trust_remote_code=True, **kwargs)
    if isinstance(loaded, tuple):  # output_loading_info=True: (model, info)
        return loaded[0].eval(), loaded[1]
    return loaded.eval()


def cached_logits(torch_model, tokens) -> np.ndarray:
    """Logits of ``tokens`` from the PyTorch model's cache: the first ``PROMPT`` at once, then one token a call."""
    output = torch_model(tokens[:, :PROMPT], use_cache=True)
    steps = [output.logits]
    for t in range(PROMPT, tokens.shape[1]):
        output = torch_model(tokens[:, t:t + 1], cache=output.cache, use_cache=True)
        steps.append(output.logits)
    return np.concatenate([step.numpy() for step in steps], axis=1)


def measure_lm(config, params, directory) -> dict:
    """Export ``params`` to ``directory``, load it in transformers, and compare logits (whole rows, and
    decoded from the cache) and greedy decoding with the JAX model's."""
    import torch

    from seqmodels.hf.export import export_model
    from seqmodels.models.lm import generate
    export_model(config, params, directory)
    torch_model = load_torch(directory)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(2, LENGTH))
    with torch.no_grad():
        torch_logits = torch_model(torch.as_tensor(tokens)).logits.numpy()
        cached = cached_logits(torch_model, torch.as_tensor(tokens))
        torch_tokens = torch_model.generate(torch.as_tensor(tokens[:, :PROMPT]), max_new_tokens=NEW_TOKENS,
                                            min_new_tokens=NEW_TOKENS, do_sample=False).numpy()
    model = jax_model(config, params)
    logits = np.asarray(jax_logits(model, jnp.asarray(tokens)))
    jax_tokens = np.asarray(generate(model, tokens[:, :PROMPT], NEW_TOKENS)[0])
    result = {"architecture": type(torch_model).__name__, "max_abs": float(np.abs(torch_logits - logits).max()),
              "cached_max_abs": float(np.abs(cached - logits).max()), "logit_scale": float(np.abs(logits).max()),
              "greedy_equal": bool(np.array_equal(torch_tokens, jax_tokens)), "torch_tokens": torch_tokens,
              "jax_tokens": jax_tokens}
    if config.kind == "ahn":  # how much the compressors move the logits (beyond the window only, by construction)
        window_only = np.asarray(jax_logits(jax_model(config, without_compressors(params)), jnp.asarray(tokens)))
        result["compressor_effect"] = float(np.abs(logits - window_only).max())
    return result


def parity_row(name: str, config, result: dict) -> str:
    """One markdown row of the parity table (an AHN model's mixers name its compressor and window)."""
    mixers = ", ".join(config.mixers)
    if config.kind == "ahn":
        mixers += (f" + {config.ahn.compressor} compressor (window {config.ahn.window}, {config.ahn.sinks} sinks; "
                   f"moves the logits by {result['compressor_effect']:.2f})")
    return (f"| {name} | {mixers} | {result['architecture']} | {result['max_abs']:.2e} | "
            f"{result['cached_max_abs']:.2e} | {result['logit_scale']:.2f} | {result['greedy_equal']} |")


def main() -> int:
    print("| config | mixers | exported as | max abs logit diff | decoded from the cache | logit scale | "
          "16 greedy tokens equal |")
    print("|---|---|---|---|---|---|---|")
    for path in CONFIGS[int(sys.argv[1]) if len(sys.argv) > 1 else 0:]:
        config = tiny_config(path)
        if config.kind not in CAUSAL_KINDS:
            continue
        with tempfile.TemporaryDirectory() as directory:
            result = measure_lm(config, random_params(config), Path(directory) / "hf")
        print(parity_row(config_name(path), config, result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
