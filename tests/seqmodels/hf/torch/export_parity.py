"""Parity of an export with the JAX model: tiny random models of every config, their logits and greedy tokens.

``python tests/seqmodels/hf/torch/export_parity.py`` prints the parity table of every config in
``configs/`` and ``configs/ablations/`` (markdown), as the tests measure it; ``--json PATH`` measures those,
the hybrid list, the setting variants and the looped variants the tests measure and writes every result to
PATH (``results/export_parity/parity.json``: the README's parity tables are generated from it by
``scripts/readme_tables.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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


HYBRID = "hybrid (GQA, q/k norm, conv, biases)"
# Mixer settings the configs leave at their defaults, each applied to the base config's tiny model.
SETTING_VARIANTS = {
    "muonssm_head_scope_polar_express": dict(
        mixers=("muonssm_gated_deltanet", "muonssm_mamba2", "muonssm_longhorn"),
        muonssm=dict(gamma=0.5, tau=0.7, ns_steps=3, ns_coefficients="polar_express", ns_scope="head"),
        mamba2=dict(gated_norm="per_head_before_gate", head_dim=32)),
    "muonssm_no_momentum_deltanet_widths": dict(
        mixers=("muonssm_gated_deltanet", "muonssm_mamba2", "deltanet"), muonssm=dict(gamma=0.0, ns_steps=2),
        deltanet=dict(head_dim=16, value_head_dim=24, conv_kernel=2)),
    "atlas_polar_express_unclipped_gradient_eta": dict(
        mixers=("atlas", "atlas_mal"), atlas=dict(ns_coefficients="polar_express", ns_steps=3, grad_clip=0.0,
                                                  eta_scales="gradient", poly_degree=3, poly_key_dim=3,
                                                  chunk_size=16, window=3)),  # 24 tokens: a partial last chunk
    "atlas_memory_norm_deep": dict(mixers=("atlas", "atlas_mag"), atlas=dict(memory_norm=True)),
    "atlas_memory_norm_linear": dict(mixers=("atlas",), atlas=dict(memory_norm=True, memory_depth=1)),
}
LOOPED_VARIANTS = {
    "looped_cfl": {},
    "looped_gated_deltanet_distinct_blocks": dict(mixer="gated_deltanet", positions="rope+sinusoidal",
                                                  share_weights=False, loop_schedule="fixed", fixed_loops=3,
                                                  attention="bidirectional", reinject=False),
}


def hybrid_config():
    """``[swa, mamba2, attention]`` with grouped-query heads, q/k norm, a short convolution, q/k/v biases."""
    from seqmodels.mixers.attention import AttentionConfig
    return dataclasses.replace(
        tiny_config(BASE_CONFIG), mixers=("swa", "mamba2", "attention"), num_heads=4, tie_embeddings=False,
        attention=AttentionConfig(num_kv_heads=2, qk_norm=True, conv_kernel=3, qkv_bias=True, rope_theta=500.0))


def setting_variant_config(variant: str):
    """The base config's tiny model with ``SETTING_VARIANTS[variant]`` applied."""
    if variant not in SETTING_VARIANTS:
        raise ValueError(f"unknown setting variant {variant!r}; known: {', '.join(SETTING_VARIANTS)}")
    base = tiny_config(BASE_CONFIG)
    changes = dict(SETTING_VARIANTS[variant])
    sections = {name: dataclasses.replace(getattr(base, name), **changes.pop(name))
                for name in ("muonssm", "mamba2", "deltanet", "atlas") if name in changes}
    return dataclasses.replace(base, **changes, **sections)


def looped_config(variant: str):
    """The looped CFL config's tiny model (vocabulary 26) with ``LOOPED_VARIANTS[variant]`` applied."""
    if variant not in LOOPED_VARIANTS:
        raise ValueError(f"unknown looped variant {variant!r}; known: {', '.join(LOOPED_VARIANTS)}")
    base = tiny_config(next(path for path in CONFIGS if path.stem == "looped_cfl"))
    return dataclasses.replace(base, vocab_size=26, looped=dataclasses.replace(base.looped, **LOOPED_VARIANTS[variant]))


def measure_looped(config, params, directory) -> dict:
    """Export the looped model, load it for sequence classification and compare, on 64 strings ``[BOS] w
    [CLS]`` (8 of each length 1..8), its vocabulary logits and accept / reject decisions with JAX's."""
    import torch

    from seqmodels.hf.export import export_model
    from seqmodels.special_tokens import ACCEPT_ID, REJECT_ID
    export_model(config, params, directory)
    torch_model = load_torch(directory, "AutoModelForSequenceClassification")
    model, rng = jax_model(config, params), np.random.default_rng(0)
    decisions, differences, heads_agree = [], [], True
    for length in range(1, 9):
        tokens = np.concatenate([np.full((8, 1), 5), rng.integers(6, 26, size=(8, length)), np.full((8, 1), 2)], 1)
        logits = np.asarray(jax_logits(model, jnp.asarray(tokens)))
        with torch.no_grad():
            output = torch_model(torch.as_tensor(tokens))
        differences.append(float(np.abs(output["vocab_logits"].numpy() - logits).max()))
        heads_agree &= bool(np.array_equal(output.logits.numpy(),
                                           output["vocab_logits"].numpy()[:, [REJECT_ID, ACCEPT_ID]]))
        decisions.append((output.logits.numpy().argmax(-1), logits[:, ACCEPT_ID] > logits[:, REJECT_ID]))
    torch_accepts = np.concatenate([d[0] for d in decisions]) == 1
    jax_accepts = np.concatenate([d[1] for d in decisions])
    return {"architecture": type(torch_model).__name__, "max_abs": max(differences), "heads_agree": heads_agree,
            "torch_accepts": torch_accepts, "jax_accepts": jax_accepts,
            "decisions_equal": bool(np.array_equal(torch_accepts, jax_accepts))}


def parity_row(name: str, config, result: dict) -> str:
    """One markdown row of the parity table (an AHN model's mixers name its compressor and window)."""
    mixers = ", ".join(config.mixers)
    if config.kind == "ahn":
        mixers += (f" + {config.ahn.compressor} compressor (window {config.ahn.window}, {config.ahn.sinks} sinks; "
                   f"moves the logits by {result['compressor_effect']:.2f})")
    return (f"| {name} | {mixers} | {result['architecture']} | {result['max_abs']:.2e} | "
            f"{result['cached_max_abs']:.2e} | {result['logit_scale']:.2f} | {result['greedy_equal']} |")


def _record(name: str, config, result: dict) -> dict:
    """What the README's tables show of one measurement (no arrays)."""
    record = {"name": name, "kind": config.kind, "mixers": list(config.mixers),
              **{key: value for key, value in result.items() if not isinstance(value, np.ndarray)}}
    if config.kind == "ahn":
        record["ahn"] = {"compressor": config.ahn.compressor, "window": config.ahn.window, "sinks": config.ahn.sinks}
    if config.kind == "looped":
        record["block_mixer"] = config.looped.mixer
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also measure the variants and write every result here")
    args = parser.parse_args(argv)
    print("| config | mixers | exported as | max abs logit diff | decoded from the cache | logit scale | "
          "16 greedy tokens equal |")
    print("|---|---|---|---|---|---|---|")
    cases = [(config_name(path), tiny_config(path)) for path in CONFIGS]
    cases = [(name, config) for name, config in cases if config.kind in CAUSAL_KINDS]
    if args.json:
        cases += [(HYBRID, hybrid_config())] + [(name, setting_variant_config(name)) for name in SETTING_VARIANTS]
    records = []
    for name, config in cases:
        with tempfile.TemporaryDirectory() as directory:
            result = measure_lm(config, random_params(config), Path(directory) / "hf")
        print(parity_row(name, config, result), flush=True)
        records.append(_record(name, config, result))
    if args.json:
        looped = []
        for name in LOOPED_VARIANTS:
            config = looped_config(name)
            with tempfile.TemporaryDirectory() as directory:
                looped.append(_record(name, config, measure_looped(config, random_params(config, noise=0.2),
                                                                   Path(directory) / "hf")))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": "python tests/seqmodels/hf/torch/export_parity.py --json " + str(args.json),
            "vocab": VOCAB, "length": LENGTH, "prompt": PROMPT, "new_tokens": NEW_TOKENS,
            "causal": records, "looped": looped}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
