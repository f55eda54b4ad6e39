"""Which parameters train: a model kind may freeze part of its parameters (AHN trains only its compressors).

``split_params(params, predicate)`` gives two pure dicts of the same nesting holding disjoint leaves:
those whose key path satisfies ``predicate`` and the rest; ``merge_params`` is its inverse. The train
step differentiates and updates only the first, and the optimizer holds state for it alone, so frozen
parameters are carried through every step bitwise unchanged.
"""

from __future__ import annotations

from flax.nnx import traversals


def split_params(params: dict, predicate) -> tuple[dict, dict]:
    """``(trainable, frozen)`` of the pure nested dict ``params``; ``predicate(path_tuple) -> bool``."""
    flat = traversals.flatten_mapping(params)
    chosen = {path: leaf for path, leaf in flat.items() if predicate(path)}
    if not chosen:
        raise ValueError("no parameter is trainable: the model's trainable filter matches none of its parameters")
    rest = {path: leaf for path, leaf in flat.items() if not predicate(path)}
    return traversals.unflatten_mapping(chosen), traversals.unflatten_mapping(rest)


def merge_params(trainable: dict, frozen: dict) -> dict:
    """The parameter dict ``split_params`` split."""
    return traversals.unflatten_mapping({**traversals.flatten_mapping(frozen),
                                         **traversals.flatten_mapping(trainable)})


def trainable_part(tree: dict, predicate) -> dict:
    """The trainable leaves of ``tree`` (``tree`` itself when ``predicate`` is None: everything trains)."""
    return tree if predicate is None else split_params(tree, predicate)[0]
