"""The CUDA kernels a twin's chunked recurrence or short convolution runs when they are installed, and the
pure-PyTorch forms (``chunked.py``, ``layers.ShortConv``) it runs everywhere else.

    op                 kernel (its package, its function)                                    layers that match
    gated_delta_rule   flash-linear-attention  fla.ops.gated_delta_rule.chunk_gated_delta_rule   Gated DeltaNet, AHN (GDN, DeltaNet)
    delta_rule         flash-linear-attention  fla.ops.delta_rule.chunk_delta_rule                DeltaNet
    simple_gla         flash-linear-attention  fla.ops.simple_gla.chunk_simple_gla                Mamba2 (without mamba_ssm), AHN (Mamba2)
    ssd                mamba_ssm               mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined   Mamba2
    causal_conv1d      causal_conv1d           causal_conv1d.causal_conv1d_fn                     every short convolution, rows without padding

Each is the same computation as the pure-PyTorch form it replaces (the recurrences' rules are in
``chunked.py``; the delta rule's scale is K^-1/2, simple GLA's K^-1/2 or 1 as the caller's, the SSD's
``h_t = exp(Delta_t A) h_{t-1} + B_t (Delta_t x_t)^T``, ``y_t = h_t^T C_t``, states ``[B, H, P, N]`` in
mamba_ssm's layout, ``[B, H, K, V]`` here). Padding needs no mask: a padded step is made a no-op through its
inputs (``g = 0`` and ``beta = 0`` or ``k = 0``; ``Delta = 0`` for the SSD), as the pure forms do, and the cached
state enters as the kernel's initial state and leaves as its final state, so prefill then decoding is the
same rule as in the pure path. Inputs are float32 as there (the kernels accept it).

**Selection.** At load time (a layer's construction) ``find_kernel(op)`` imports the package's function,
once per process, by ``importlib`` (an export must load where none of these packages is installed, and
``transformers``' remote-code loader refuses a file that names a missing package in an ``import``
statement), and keeps it only when CUDA is available. A call runs the kernel when one was found, its
tensors are on a device the kernel runs on and ``use_kernels`` is on (``set_kernels(model, False)`` forces the
pure path, e.g. to compare the two); otherwise the pure-PyTorch form. Which kernels a model holds:
``kernels_in(model)``. ``register_kernel(op, function, devices)`` puts another implementation of the same
signature in the table (the tests run fla's own PyTorch references through it on the CPU).

Layers without a matching kernel run the pure path on every device: MuonSSM's momentum scans, LongHorn's
diagonal scan, Atlas's memory, attention (``torch.nn.functional.scaled_dot_product_attention``, which picks
its own fused kernels).
"""

from __future__ import annotations

import importlib
from typing import Callable, NamedTuple

import torch
from torch import nn

from .chunked import chunk_delta_rule, chunk_gated_linear


class Kernel(NamedTuple):
    """A kernel: ``function`` with its package's signature, the ``devices`` (``torch.device.type`` s) it runs on."""

    name: str
    function: Callable
    devices: tuple[str, ...] = ("cuda",)


KERNEL_SOURCES = {  # op -> (module, function name) of the package that provides it
    "gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "delta_rule": ("fla.ops.delta_rule", "chunk_delta_rule"),
    "simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
    "ssd": ("mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined"),
    "causal_conv1d": ("causal_conv1d", "causal_conv1d_fn"),
}
_FOUND: dict[str, Kernel | None] = {}


def _check_op(op: str) -> None:
    if op not in KERNEL_SOURCES:
        raise ValueError(f"unknown kernel op {op!r}; ops: {', '.join(KERNEL_SOURCES)}")


def register_kernel(op: str, function: Callable, devices=("cuda",), name: str | None = None) -> None:
    """Make ``function`` (the signature of ``KERNEL_SOURCES[op]``'s function) the kernel of ``op`` on ``devices``
    for every layer built from now on; ``function`` None forgets it (the next layer looks the package up again)."""
    _check_op(op)
    if function is None:
        _FOUND.pop(op, None)
        return
    if not callable(function) or not devices or not all(isinstance(d, str) for d in devices):
        raise ValueError(f"register_kernel({op!r}): need a callable and a non-empty tuple of device types, got "
                         f"{function!r}, {devices!r}")
    _FOUND[op] = Kernel(name or getattr(function, "__qualname__", repr(function)), function, tuple(devices))


def find_kernel(op: str) -> Kernel | None:
    """``op``'s kernel, or None where its package is missing or there is no CUDA device (the module docstring)."""
    _check_op(op)
    if op not in _FOUND:
        module, function = KERNEL_SOURCES[op]
        found = None
        if torch.cuda.is_available():
            try:
                found = Kernel(f"{module}.{function}", getattr(importlib.import_module(module), function))
            except Exception:  # not installed, or installed without its compiled parts: the pure path
                found = None
        _FOUND[op] = found
    return _FOUND[op]


class KernelChoice:
    """What a layer with kernels holds: ``kernels`` (op -> Kernel or None, found at construction) and
    ``use_kernels`` (``set_kernels``)."""

    use_kernels = True

    def find_kernels(self, *ops: str) -> None:
        self.kernels = {op: find_kernel(op) for op in ops}

    def kernel(self, op: str, tensor: torch.Tensor) -> Kernel | None:
        """The kernel to run ``op`` on ``tensor`` 's device now, or None (the pure path)."""
        kernel = self.kernels.get(op)
        if not self.use_kernels or kernel is None or tensor.device.type not in kernel.devices:
            return None
        return kernel


def set_kernels(model: nn.Module, enabled: bool) -> int:
    """Turn the kernels of every layer of ``model`` on (where found) or off; the number of layers set."""
    if not isinstance(enabled, bool):
        raise ValueError(f"set_kernels: enabled must be True or False, got {enabled!r}")
    count = 0
    for module in model.modules():  # by attribute: a loaded export's modules are copies of these classes
        if isinstance(getattr(module, "kernels", None), dict) and hasattr(module, "use_kernels"):
            module.use_kernels = enabled
            count += 1
    return count


def kernels_in(model: nn.Module) -> dict[str, str]:
    """``{op: kernel name}`` of the kernels ``model`` 's layers found at load time (empty: the pure path only)."""
    return {op: kernel.name for module in model.modules() if isinstance(getattr(module, "kernels", None), dict)
            for op, kernel in module.kernels.items() if kernel is not None}


def _zero_at_padding(valid, *inputs):
    """Each of ``inputs`` ([B, T, H, ...]) in float32, 0 at padded steps (``valid [B, T]`` False): a step with zero
    log decay and zero ``beta`` / ``k`` / ``Delta`` leaves the state as it was. No host sync: always ``where``."""
    if valid is None:
        return tuple(x.float() for x in inputs)
    return tuple(torch.where(valid.reshape(valid.shape + (1,) * (x.ndim - 2)), x.float(), 0.0) for x in inputs)


def delta_rule(layer: KernelChoice, q, k, v, beta, log_decay, state, valid=None, chunk_size=64, gated=True):
    """``chunked.chunk_delta_rule`` (same arguments and results), by fla's kernel where ``layer`` has one."""
    kernel = layer.kernel("gated_delta_rule" if gated else "delta_rule", q)
    if kernel is None:
        return chunk_delta_rule(q, k, v, beta, log_decay, state, valid, chunk_size=chunk_size)
    log_decay, beta = _zero_at_padding(valid, log_decay, beta)
    scale, q, k, v = q.shape[-1] ** -0.5, q.float(), k.float(), v.float()
    if gated:
        o, final = kernel.function(q, k, v, log_decay, beta, scale=scale, initial_state=state.float(),
                                   output_final_state=True)
    else:
        o, final = kernel.function(q, k, v, beta, scale=scale, initial_state=state.float(), output_final_state=True)
    return o.float(), final.float()


def gated_linear(layer: KernelChoice, q, k, v, log_decay, state, valid=None, chunk_size=64, scale=None):
    """``chunked.chunk_gated_linear`` (same arguments and results), by fla's simple GLA where ``layer`` has it."""
    kernel = layer.kernel("simple_gla", q)
    if kernel is None:
        return chunk_gated_linear(q, k, v, log_decay, state, valid, chunk_size=chunk_size, scale=scale)
    log_decay, k = _zero_at_padding(valid, log_decay, k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, final = kernel.function(q.float(), k, v.float(), g=log_decay, scale=scale, initial_state=state.float(),
                               output_final_state=True)
    return o.float(), final.float()


def ssd(kernel: Kernel, c, b, x, delta, a, state, valid=None, chunk_size=64):
    """Mamba2's scan by mamba_ssm's ``kernel``: ``(y [B, T, H, P], final state [B, H, N, P])`` of
    ``h = exp(Delta A) h + b (Delta x)^T``, ``y = h^T c`` (``c, b [B, T, N]`` shared by the heads, ``x [B, T, H, P]``,
    ``delta [B, T, H]``, ``a [H]`` < 0); the same as ``gated_linear`` of ``(c, b, Delta x, Delta A)`` with scale 1."""
    (delta,) = _zero_at_padding(valid, delta)
    y, final = kernel.function(x.float(), delta, a.float(), b.float()[:, :, None], c.float()[:, :, None], chunk_size,
                               initial_states=state.float().transpose(-1, -2).contiguous(), return_final_states=True)
    return y.float(), final.float().transpose(-1, -2)


def causal_conv(layer: KernelChoice, full: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """``y [B, T, C]``, ``y_t = b + sum_k w_k full_{t+k}`` of ``full [B, K - 1 + T, C]`` (the history, then the
    inputs) and ``weight [C, K]``, by causal_conv1d's kernel where ``layer`` has it; None otherwise (the caller's
    own form)."""
    kernel = layer.kernel("causal_conv1d", full)
    if kernel is None:
        return None
    y = kernel.function(full.transpose(1, 2).contiguous(), weight.contiguous(), bias, activation=None)  # [B, C, K-1+T]
    return y[:, :, weight.shape[-1] - 1:].transpose(1, 2)
