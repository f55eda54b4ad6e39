"""Parameters <-> the named tensors of a safetensors checkpoint, by one ``TensorRule`` per tensor.

A format (``seqmodels.hf.llama``, ``seqmodels.hf.remote_code``) states its rules: each names a tensor,
the parameter path it holds and the two layout maps, each a transpose, reshape or flip, so a rule is a
bijection and a float32 round trip is bitwise. A ``JoinedRule`` is one tensor that holds several
parameters side by side along an axis (Mamba2's ``in_proj`` and ``conv1d``), each piece by its own rule.
Writing casts every mapped array to the export dtype; reading checks the checkpoint's names and shapes
against the rules before anything is converted.
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


@dataclass(frozen=True)
class JoinedRule:
    """One checkpoint tensor of several parameters concatenated along ``axis`` (Hugging Face layout), in order of
    ``parts``: each part's ``path`` and layout maps give its piece (its ``hf_name`` is the piece's, for messages)."""

    hf_name: str
    parts: tuple[TensorRule, ...]
    axis: int = 0


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


def _hf_array(rule, params: dict) -> np.ndarray:
    if isinstance(rule, JoinedRule):
        return np.concatenate([_hf_array(part, params) for part in rule.parts], axis=rule.axis)
    return rule.to_hf(np.asarray(get_path(params, rule.path), np.float32))


def tensors_of(params: dict, rules: list, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Every rule's tensor of the parameter dict ``params`` (``nnx.to_pure_dict`` layout), cast to ``dtype``."""
    check_export_dtype(dtype)
    return {rule.hf_name: np.ascontiguousarray(_hf_array(rule, params)).astype(EXPORT_DTYPES[dtype]) for rule in rules}


def hf_shape(rule: TensorRule, shape: tuple) -> tuple:
    """The checkpoint's shape of a parameter of ``shape`` under ``rule``."""
    return tuple(np.shape(rule.to_hf(np.empty(shape, np.uint8))))


def _expected_shape(rule, template: dict) -> tuple:
    if isinstance(rule, JoinedRule):
        shapes = [_expected_shape(part, template) for part in rule.parts]
        joined = list(shapes[0])
        joined[rule.axis] = sum(shape[rule.axis] for shape in shapes)
        return tuple(joined)
    return hf_shape(rule, tuple(get_path(template, rule.path).shape))


def _fill(rule, array: np.ndarray, template: dict) -> None:
    if isinstance(rule, JoinedRule):
        sizes = np.cumsum([_expected_shape(part, template)[rule.axis] for part in rule.parts])[:-1]
        for part, piece in zip(rule.parts, np.split(array, sizes, axis=rule.axis)):
            _fill(part, piece, template)
        return
    set_path(template, rule.path, jnp.asarray(rule.to_project(array)))


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


def fill_params(directory: Path, rules: list, template: dict,
                tolerated: Callable[[str], bool] = lambda name: False) -> dict:
    """``template`` (a parameter dict of the right shapes) filled with the float32 tensors of the checkpoint in
    ``directory``; ``HFFormatError`` for a missing, unexpected (and not ``tolerated``) or misshapen tensor."""
    checkpoint = SafetensorsCheckpoint(directory)
    _check_names(checkpoint, {rule.hf_name for rule in rules}, tolerated)
    for rule in rules:
        expected = _expected_shape(rule, template)
        if checkpoint.shape(rule.hf_name) != expected:
            raise HFFormatError(f"{checkpoint.file_of(rule.hf_name)}: tensor {rule.hf_name!r} has shape "
                                f"{list(checkpoint.shape(rule.hf_name))}; {Path(directory) / 'config.json'} implies "
                                f"{list(expected)}")
        _fill(rule, checkpoint.read(rule.hf_name).astype(np.float32), template)
    return template
