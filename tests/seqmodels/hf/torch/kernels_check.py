"""Run exported twins through flash-linear-attention's kernel interface and measure them against the pure path.

``python kernels_check.py {fla|mamba} DIR [DIR ...]`` prints a line ``result: JSON``: for each export directory, the kernels its
layers selected, how often each was called, and the max abs differences between the kernels' path and the
pure-PyTorch path (``kernels.set_kernels(model, False)``) in: the logits of a batch with a left-padded row and a
row with padding inside; the logits of a prefill, a chunked call from its cache (the state goes into a kernel as its
initial state and comes out as its final state) and then decoded tokens; every parameter's gradient of the LM loss. It runs in the test's environment with fla installed
(``test_cuda_kernels.py``), over the repository's own ``seqmodels.hf.torch`` (``PYTHONPATH``).

fla's kernels are Triton, which needs a GPU (and fla 0.6.0's do not run under Triton's interpreter here). So each
op's kernel is registered (``kernels.register_kernel``, on the CPU) as a stand-in that first binds its arguments to
the signature of fla's real function (``inspect.signature(real).bind``: a call the real function would not take
fails here) and then runs fla's own PyTorch reference of that op by those arguments:

* ``chunk_gated_delta_rule`` -> ``fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule``;
* ``chunk_delta_rule`` -> ``fla.ops.delta_rule.naive.delta_rule_recurrence`` (heads first; its scale is K^-1/2);
* ``chunk_simple_gla`` -> ``fla.ops.simple_gla.naive.naive_recurrent_simple_gla``;

and with ``mamba`` (an environment with mamba_ssm and causal_conv1d, installed without their CUDA builds):

* ``mamba_chunk_scan_combined`` -> ``mamba_ssm.modules.ssd_minimal.ssd_minimal_discrete`` (per-token ``Delta x`` and
  ``Delta A``, the groups' ``B``, ``C`` repeated over their heads, whole chunks);
* ``causal_conv1d_fn`` -> ``causal_conv1d.causal_conv1d_interface.causal_conv1d_ref``.

A stand-in refuses the options the twins must not use (variable-length ``cu_seqlens``, fla's in-kernel L2 norm,
sigmoid or gate, a state without ``output_final_state``), so a call that relied on them fails.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections import Counter

RESULT = "result: "
CALLS: Counter = Counter()


def _stand_in(op: str, real, reference):
    signature = inspect.signature(real)

    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        extra = arguments.pop("kwargs", {})
        assert not extra, f"{op}: arguments fla's function does not name: {sorted(extra)}"
        for name in ("cu_seqlens", "cu_seqlens_cpu", "chunk_indices", "cp_context"):
            assert arguments.get(name) is None, f"{op}: {name} given"
        for name in ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first"):
            assert not arguments.get(name, False), f"{op}: {name} set"
        if "initial_state" in arguments:  # fla's
            assert arguments["initial_state"] is not None and arguments["output_final_state"], op
        CALLS[op] += 1
        return reference(arguments)
    return call


def register_stand_ins():
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.simple_gla import chunk_simple_gla
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    from seqmodels.hf.torch.kernels import register_kernel

    def gated(a):
        return naive_recurrent_gated_delta_rule(a["q"], a["k"], a["v"], a["beta"], a["g"], scale=a["scale"],
                                                initial_state=a["initial_state"], output_final_state=True)

    def plain(a):
        assert abs(a["scale"] - a["q"].shape[-1] ** -0.5) < 1e-12, "fla's reference scales by K^-1/2 only"
        o, state = delta_rule_recurrence(*(a[name].transpose(1, 2) for name in ("q", "k", "v", "beta")),
                                         initial_state=a["initial_state"], output_final_state=True)
        return o.transpose(1, 2), state

    def simple_gla(a):
        return naive_recurrent_simple_gla(a["q"], a["k"], a["v"], a["g"], scale=a["scale"],
                                          initial_state=a["initial_state"], output_final_state=True)

    for op, real, reference in (("gated_delta_rule", chunk_gated_delta_rule, gated),
                                ("delta_rule", chunk_delta_rule, plain),
                                ("simple_gla", chunk_simple_gla, simple_gla)):
        register_kernel(op, _stand_in(op, real, reference), devices=("cpu",), name=f"fla {real.__name__} (stand-in)")


def register_mamba_stand_ins():
    """mamba_ssm's ``mamba_chunk_scan_combined`` through its ``ssd_minimal_discrete``, causal_conv1d's
    ``causal_conv1d_fn`` through its ``causal_conv1d_ref``. Their compiled extensions are absent on a CPU machine
    (installed without their CUDA builds): empty modules stand in for them so the packages' Python imports."""
    import types
    for name in ("selective_scan_cuda", "causal_conv1d_cuda"):
        sys.modules.setdefault(name, types.ModuleType(name))
    import torch
    import torch.nn.functional as F
    from causal_conv1d import causal_conv1d_fn
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref
    from mamba_ssm.modules.ssd_minimal import ssd_minimal_discrete
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    from seqmodels.hf.torch.kernels import register_kernel

    def ssd(a):
        for name in ("D", "z", "dt_bias", "seq_idx"):
            assert a[name] is None, f"ssd: {name} given"
        assert not a["dt_softplus"] and a["return_final_states"] and a["initial_states"] is not None
        x, dt, heads = a["x"], a["dt"], a["x"].shape[2]
        b, c = (a[name].repeat_interleave(heads // a[name].shape[2], dim=2) for name in ("B", "C"))
        length, block = x.shape[1], a["chunk_size"]
        pad = -length % block  # the reference takes whole chunks: zero steps (no decay, no input) after the row
        inputs = [F.pad(t, (0, 0) * (t.ndim - 2) + (0, pad)) for t in (x * dt[..., None], a["A"] * dt, b, c)]
        y, final = ssd_minimal_discrete(*inputs, block, initial_states=a["initial_states"][:, None])
        return y[:, :length], final

    register_kernel("ssd", _stand_in("ssd", mamba_chunk_scan_combined, ssd), devices=("cpu",),
                    name="mamba_ssm mamba_chunk_scan_combined (stand-in)")

    def conv(a):
        assert a["seq_idx"] is None and a["initial_states"] is None and not a["return_final_states"]
        return causal_conv1d_ref(a["x"], a["weight"], a["bias"], activation=a["activation"])

    register_kernel("causal_conv1d", _stand_in("causal_conv1d", causal_conv1d_fn, conv), devices=("cpu",),
                    name="causal_conv1d causal_conv1d_fn (stand-in)")


def measure(directory: str) -> dict:
    import torch

    from seqmodels.hf.torch.chunked import set_scan_form
    from seqmodels.hf.torch.kernels import kernels_in, set_kernels
    from seqmodels.hf.torch.lm import CACHE_FIELD, SeqmodelsForCausalLM
    torch.manual_seed(0)
    model = SeqmodelsForCausalLM.from_pretrained(directory).eval()
    set_scan_form(model, "auto", chunk_size=16)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 37), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, and padding that ends the first call of row 1 (its state must pass unchanged)
    mask[1, 17:21] = 0

    def run(enabled: bool):
        set_kernels(model, enabled)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
            output = model(ids[:, :21], attention_mask=mask[:, :21], use_cache=True)
            steps = [output.logits]
            for start, end in [(21, 29)] + [(t, t + 1) for t in range(29, 37)]:  # a chunked call from the cache
                output = model(ids[:, start:end], attention_mask=mask[:, :end], use_cache=True,
                               **{CACHE_FIELD: getattr(output, CACHE_FIELD)})
                steps.append(output.logits)
        model.zero_grad(set_to_none=True)
        labels = torch.where(mask > 0, ids, -100)
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return logits, torch.cat(steps, dim=1), grads

    before = Counter(CALLS)
    kernel_logits, kernel_decoded, kernel_grads = run(True)
    calls = {op: CALLS[op] - before[op] for op in CALLS if CALLS[op] > before[op]}
    pure_logits, pure_decoded, pure_grads = run(False)
    assert sum(CALLS.values()) == sum(before.values()) + sum(calls.values()), "a kernel ran with kernels off"
    return {"kernels": kernels_in(model), "calls": calls, "max_abs_logit": float(pure_logits.abs().max()),
            "logits": float((kernel_logits - pure_logits).abs().max()),
            "decoded": float((kernel_decoded - pure_logits).abs().max()),
            "gradients": max(float(((kernel_grads[n] - g).abs().max() / g.abs().max().clamp_min(1.0)))
                             for n, g in pure_grads.items()),
            "gradient_tensors": len(pure_grads)}


def main(packages: str, directories: list[str]) -> None:
    {"fla": register_stand_ins, "mamba": register_mamba_stand_ins}[packages]()
    print(RESULT + json.dumps({directory: measure(directory) for directory in directories}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
