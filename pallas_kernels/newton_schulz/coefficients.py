"""Coefficient schedules for the quintic Newton–Schulz iteration X <- a X + (b A + c A A) X.

Each step applies the odd polynomial p(s) = a s + b s^3 + c s^5 to every singular value s of X.

``"muon"``: (3.4445, -4.7750, 2.0315) at every step (the Muon optimizer's quintic). It does not
converge to the polar factor: with s_0 in (0, 1] it drives singular values into a band around 1
(about [0.68, 1.13] after 5 steps for well-conditioned inputs) and then oscillates inside it.

``"polar_express"``: the degree-5 schedule of Algorithm 1 in Amsel, Persson, Musco & Gower,
"The Polar Express: Optimal Matrix Sign Methods and Their Application to the Muon Algorithm"
(arXiv:2505.16932, 2025): minimax-optimal polynomials for singular values in [1e-3, 1]. As in that
algorithm, every row but the last is evaluated at s / 1.01 (the table's (a, b, c) divided by
(1.01, 1.01^3, 1.01^5)) so round-off above the upper bound cannot grow, the last row
(1.875, -1.25, 0.375) is kept as is and repeats for steps beyond the table, and the input is
normalised by 1.01 ||x||_F + eps instead of ||x||_F + eps (``norm_scale`` = 1.01). The table is the
paper's Algorithm 1 (and its repository, github.com/NoahAmsel/PolarExpress) digit for digit. One
departure: Algorithm 1 always iterates in bf16; here the input's dtype picks the precision (fp32
exact, bf16 operands with fp32 accumulation: ``xla.operand_policy``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Triple = tuple[float, float, float]

MUON: Triple = (3.4445, -4.7750, 2.0315)

# Algorithm 1 of arXiv:2505.16932, before its safety scaling (applied in `_polar_express`).
_POLAR_EXPRESS_TABLE: tuple[Triple, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
_POLAR_EXPRESS_SAFETY = 1.01


def _polar_express(steps: int) -> tuple[Triple, ...]:
    safety = _POLAR_EXPRESS_SAFETY
    scaled = tuple((a / safety, b / safety**3, c / safety**5) for a, b, c in _POLAR_EXPRESS_TABLE[:-1])
    table = scaled + _POLAR_EXPRESS_TABLE[-1:]
    return table[:steps] + table[-1:] * max(0, steps - len(table))


def resolve_coefficients(coefficients, steps) -> tuple[tuple[Triple, ...], float]:
    """Return ``(per-step (a, b, c) triples, norm_scale)`` for ``coefficients`` over ``steps`` steps.

    ``coefficients`` is ``"muon"``, ``"polar_express"`` or a sequence of (a, b, c) triples whose
    length is ``steps`` (one per step) or 1 (repeated). ``norm_scale`` multiplies ||x||_F in the
    input normalisation X_0 = x / (norm_scale ||x||_F + eps).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    if isinstance(coefficients, str):
        if coefficients == "muon":
            return (MUON,) * steps, 1.0
        if coefficients == "polar_express":
            return _polar_express(steps), _POLAR_EXPRESS_SAFETY
        raise ValueError(
            f"coefficients must be 'muon', 'polar_express' or a sequence of (a, b, c) triples, "
            f"got {coefficients!r}"
        )
    if not isinstance(coefficients, Sequence) or len(coefficients) not in (1, steps):
        length = len(coefficients) if isinstance(coefficients, Sequence) else "no length"
        raise ValueError(
            f"coefficients must hold 1 or steps={steps} (a, b, c) triples, got {length}: {coefficients!r}"
        )
    triples = tuple(_check_triple(i, row) for i, row in enumerate(coefficients))
    return (triples * steps if len(triples) == 1 else triples)[:steps], 1.0


def _check_triple(index: int, row) -> Triple:
    ok = isinstance(row, Sequence) and not isinstance(row, str) and len(row) == 3
    if ok:
        try:
            values = tuple(float(v) for v in row)
        except (TypeError, ValueError):
            ok = False
        else:
            ok = all(math.isfinite(v) for v in values)
    if not ok:
        raise ValueError(f"coefficients[{index}] must be a triple of finite numbers (a, b, c), got {row!r}")
    return values
