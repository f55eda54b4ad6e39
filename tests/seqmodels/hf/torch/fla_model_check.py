"""Load an ``export.py --format fla`` directory with flash-linear-attention and measure its logits.

``python fla_model_check.py DIR EXPECTED.npz`` prints a line ``result: JSON``: the class that
``AutoModelForCausalLM`` (after ``import fla``) loaded, the checkpoint's missing / unexpected / mismatched keys,
the max abs difference of the logits of ``EXPECTED.npz``'s ``tokens`` from its ``logits``, and which of fla's
operations ran as a PyTorch stand-in. It imports torch, transformers, fla and numpy only (no seqmodels, no
JAX): it runs in the test's environment with fla installed (``test_fla_export.py``).

fla's kernels are Triton, which needs a GPU. Without one, the operations the two layers call are replaced
(``STAND_INS``) by PyTorch functions of the same arguments, the recurrences by fla's own references:

* ``chunk_ / fused_recurrent_gated_delta_rule`` (``fla.layers.gated_deltanet``): q, k L2-normalised
  (``x / sqrt(sum x^2 + 1e-6)``, fla's ``l2norm_fwd``), beta = sigmoid(beta) (times 2 with negative eigenvalues),
  the gate by fla's ``naive_gdn_gate``, then fla's ``naive_recurrent_gated_delta_rule``;
* ``chunk_ / fused_recurrent_delta_rule`` (``fla.layers.delta_net``): the L2 norm above, then fla's
  ``delta_rule_recurrence``;
* ``ShortConvolution.forward``: a depthwise causal ``conv1d`` of its weight (and bias), then its activation;
* ``FusedRMSNormGated.forward``: ``x / sqrt(mean(x^2) + eps) * weight * act(g)`` in float32;
* ``fla.modules.mlp.swiglu``: ``silu(gate) * up``; and the config's ``fuse_norm`` / ``fuse_swiglu`` set False
  (``torch.nn.RMSNorm``, the unfused MLP).
"""

from __future__ import annotations

import json
import sys

import numpy as np

RESULT = "result: "  # the line of stdout that holds the JSON


def _l2norm(x):
    import torch
    x32 = x.float()
    return x32 * torch.rsqrt(x32.square().sum(-1, keepdim=True) + 1e-6)


def _gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                      use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, cu_seqlens=None,
                      use_gate_in_kernel=False, A_log=None, dt_bias=None, scale=None, **unused):
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    assert cu_seqlens is None and initial_state is None, "the stand-in runs whole unpadded rows from a zero state"
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    beta = beta.float().sigmoid() if use_beta_sigmoid_in_kernel else beta.float()
    beta = beta * 2 if allow_neg_eigval else beta
    g = naive_gdn_gate(g, A_log, dt_bias) if use_gate_in_kernel else g.float()
    o, _ = naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale)
    return o.to(v.dtype), None


def _delta_rule(q, k, v, beta, initial_state=None, output_final_state=False, cu_seqlens=None,
                use_qk_l2norm_in_kernel=False, **unused):
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    assert cu_seqlens is None and initial_state is None, "the stand-in runs whole unpadded rows from a zero state"
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    head_first = [x.transpose(1, 2) for x in (q, k, v, beta)]  # [B, H, T, ...]
    o, _ = delta_rule_recurrence(*head_first, output_final_state=False)
    return o.transpose(1, 2).to(v.dtype), None


def _short_convolution(self, x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None,
                       **unused):
    import torch.nn.functional as F
    assert cache is None and cu_seqlens is None and residual is None and mask is None
    width = self.kernel_size[0]
    y = F.conv1d(F.pad(x.transpose(1, 2), (width - 1, 0)), self.weight, self.bias, groups=x.shape[-1])
    y = y.transpose(1, 2)
    return (F.silu(y) if self.activation in ("silu", "swish") else y), None


def _rms_norm_gated(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    import torch
    assert residual is None and not prenorm
    x32, g32 = x.float(), g.float()
    y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()
    gate = torch.sigmoid(g32) if self.activation == "sigmoid" else g32 * torch.sigmoid(g32)
    return (y * gate).to(x.dtype)


def _swiglu(gate, up):
    import torch.nn.functional as F
    return F.silu(gate) * up


STAND_INS = ("fla.layers.gated_deltanet.chunk_gated_delta_rule",
             "fla.layers.gated_deltanet.fused_recurrent_gated_delta_rule",
             "fla.layers.delta_net.chunk_delta_rule", "fla.layers.delta_net.fused_recurrent_delta_rule",
             "fla.modules.ShortConvolution.forward", "fla.modules.FusedRMSNormGated.forward",
             "fla.modules.mlp.swiglu")


def use_stand_ins() -> dict:
    """Replace fla's Triton operations by the PyTorch ones (module docstring); the config overrides to load with."""
    import fla.layers.delta_net as delta_net
    import fla.layers.gated_deltanet as gated_deltanet
    import fla.modules as modules
    import fla.modules.mlp as mlp
    gated_deltanet.chunk_gated_delta_rule = gated_deltanet.fused_recurrent_gated_delta_rule = _gated_delta_rule
    delta_net.chunk_delta_rule = delta_net.fused_recurrent_delta_rule = _delta_rule
    modules.ShortConvolution.forward = _short_convolution
    modules.FusedRMSNormGated.forward = _rms_norm_gated
    mlp.swiglu = _swiglu
    return {"fuse_norm": False, "fuse_swiglu": False}


def main(directory: str, expected_path: str) -> dict:
    import fla  # noqa: F401  (registers gated_deltanet / delta_net with the Auto classes)
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(1)
    on_gpu = torch.cuda.is_available()
    overrides = {} if on_gpu else use_stand_ins()
    model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True, dtype=torch.float32,
                                                       **overrides)
    model = model.eval().to("cuda" if on_gpu else "cpu")
    expected = np.load(expected_path)
    tokens = torch.as_tensor(expected["tokens"], dtype=torch.long, device=model.device)
    with torch.no_grad():
        logits = model(tokens).logits.float().cpu().numpy()
    return {"class": type(model).__name__, "device": "cuda" if on_gpu else "cpu",
            "stand_ins": [] if on_gpu else list(STAND_INS),
            "missing": sorted(info.get("missing_keys", [])), "unexpected": sorted(info.get("unexpected_keys", [])),
            "mismatched": [str(item) for item in info.get("mismatched_keys", [])],
            "max_logit_error": float(np.abs(logits - expected["logits"]).max()),
            "max_abs_logit": float(np.abs(expected["logits"]).max())}


if __name__ == "__main__":
    print(RESULT + json.dumps(main(sys.argv[1], sys.argv[2])))
