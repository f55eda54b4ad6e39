"""Parameters <-> the named tensors of a safetensors checkpoint, by one ``TensorRule`` per tensor.

A format (``seqmodels.hf.llama``, ``seqmodels.hf.remote_code``) states its rules: each names a tensor,
the parameter path it holds and the two layout maps, each a transpose, reshape or flip, so a rule is a
bijection and a float32 round trip is bitwise. Writing casts every mapped array to the export dtype;
reading checks the checkpoint's names and shapes against the rules before anything is converted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from seqmodels.errors import HFFormatError
from seqmodels.hf.safetensors_io import SafetensorsCheckpoint

ParamPath = tuple  # a path into the nested parameter dict, e.g. ("blocks", 0, "mixer", "query", "kernel")
EXPORT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@dataclass(frozen=True)
class TensorRule:
    """One checkpoint tensor: its name, the parameter path it fills, and the two layout maps."""

    hf_name: str
    path: ParamPath
    to_project: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]


def get_path(tree: dict, path: ParamPath):
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict, path: ParamPath, value) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def check_export_dtype(dtype: str) -> None:
    if dtype not in EXPORT_DTYPES:
        raise HFFormatError(f"dtype {dtype!r} is not an export dtype; one of {', '.join(EXPORT_DTYPES)}")


def tensors_of(params: dict, rules: list[TensorRule], dtype: str = "float32") -> dict[str, np.ndarray]:
    """Every rule's tensor of the parameter dict ``params`` (``nnx.to_pure_dict`` layout), cast to ``dtype``."""
    check_export_dtype(dtype)
    return {rule.hf_name: np.ascontiguousarray(rule.to_hf(np.asarray(get_path(params, rule.path), np.float32)))
            .astype(EXPORT_DTYPES[dtype]) for rule in rules}


def hf_shape(rule: TensorRule, shape: tuple) -> tuple:
    """The checkpoint's shape of a parameter of ``shape`` under ``rule``."""
    return tuple(np.shape(rule.to_hf(np.empty(shape, np.uint8))))


def _check_names(checkpoint: SafetensorsCheckpoint, wanted: set[str], tolerated: Callable[[str], bool]) -> None:
    present = set(checkpoint.names())
    missing = sorted(wanted - present)
    if missing:
        raise HFFormatError(f"{checkpoint.directory}: tensor {missing[0]!r} is missing ({len(missing)} missing in "
                            "all); the checkpoint does not hold the model its config.json describes")
    unexpected = sorted(name for name in present - wanted if not tolerated(name))
    if unexpected:
        raise HFFormatError(f"{checkpoint.file_of(unexpected[0])}: tensor {unexpected[0]!r} is not part of the "
                            f"architecture config.json describes ({len(unexpected)} such tensors)")


def fill_params(directory: Path, rules: list[TensorRule], template: dict,
                tolerated: Callable[[str], bool] = lambda name: False) -> dict:
    """``template`` (a parameter dict of the right shapes) filled with the float32 tensors of the checkpoint in
    ``directory``; ``HFFormatError`` for a missing, unexpected (and not ``tolerated``) or misshapen tensor."""
    checkpoint = SafetensorsCheckpoint(directory)
    _check_names(checkpoint, {rule.hf_name for rule in rules}, tolerated)
    for rule in rules:
        expected = hf_shape(rule, tuple(get_path(template, rule.path).shape))
        if checkpoint.shape(rule.hf_name) != expected:
            raise HFFormatError(f"{checkpoint.file_of(rule.hf_name)}: tensor {rule.hf_name!r} has shape "
                                f"{list(checkpoint.shape(rule.hf_name))}; {Path(directory) / 'config.json'} implies "
                                f"{list(expected)}")
        set_path(template, rule.path, jnp.asarray(rule.to_project(checkpoint.read(rule.hf_name).astype(np.float32))))
    return template
