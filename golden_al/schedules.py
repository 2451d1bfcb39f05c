"""Per-position acceptance schedules: turn one published mean AL into rates for k draft positions.

A schedule is the list of UNCONDITIONAL rates r_i = P(draft i accepted), i = 1..k. Drafts are
accepted as a prefix, so the rates are non-increasing and the expected tokens per verify step
is AL = 1 + sum(r). Only the mean is published; the schedule is a modelling choice:

- min-variance (vLLM's synthetic rejection sampler): accept floor(AL-1) drafts always and one
  more with probability frac(AL-1). The accepted count only ever takes two neighbouring values.
- geometric: a constant conditional acceptance a at every position (r_i = a^i), the shape of a
  draft whose per-token agreement with the target does not depend on depth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from golden_al.curves import CurveError

# Published ALs have two decimals; rounding the fractional part drops binary noise so that
# 3.51 at k=5 gives exactly [1, 1, 0.51, 0, 0] and rates sum back to the published value.
_FRACTION_DIGITS = 12
_BISECTION_STEPS = 200


def check_al(al: float, k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise CurveError(f"draft length k must be an integer >= 1, got {k!r}")
    if not (math.isfinite(al) and 1 <= al <= k + 1):
        raise CurveError(f"acceptance length {al} outside [1, {k + 1}] for k={k}")


def min_variance_rates(al: float, k: int) -> list[float]:
    """[1]*floor(AL-1) + [frac(AL-1)] + [0]*rest, length k."""
    check_al(al, k)
    always = min(math.floor(al - 1), k)
    fraction = round(al - 1 - always, _FRACTION_DIGITS)
    rates = [1.0] * always
    if always < k:
        rates.append(fraction)
    return rates + [0.0] * (k - len(rates))


def geometric_rates(al: float, k: int) -> list[float]:
    """r_i = a^i with a in [0, 1] such that 1 + sum_{i=1..k} a^i = AL (solved by bisection)."""
    check_al(al, k)
    low, high = 0.0, 1.0
    # 1 + sum a^i rises monotonically from 1 (a=0) to k+1 (a=1), so bisection always converges.
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        if 1 + sum(mid**i for i in range(1, k + 1)) < al:
            low = mid
        else:
            high = mid
        if high - low < 1e-15:
            break
    a = (low + high) / 2
    return [a**i for i in range(1, k + 1)]


SCHEDULES: dict[str, Callable[[float, int], list[float]]] = {
    "min-variance": min_variance_rates,
    "geometric": geometric_rates,
}


def schedule_rates(schedule: str, al: float, k: int) -> list[float]:
    """Rates from a schedule chosen by name (`min-variance` or `geometric`)."""
    if schedule not in SCHEDULES:
        raise CurveError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    return SCHEDULES[schedule](al, k)


def validate_rates(rates: Sequence[float], k: int) -> list[float]:
    """Check a schedule (length k, each in [0, 1], non-increasing) and return it as floats."""
    values = [float(r) for r in rates]
    if len(values) != k:
        raise CurveError(f"acceptance rates: expected {k} values (one per draft), got {len(values)}")
    for position, rate in enumerate(values, start=1):
        if not (math.isfinite(rate) and 0 <= rate <= 1):
            raise CurveError(f"acceptance rates: position {position} rate {rate} outside [0, 1]")
    for position in range(1, k):
        if values[position] > values[position - 1]:
            raise CurveError(
                f"acceptance rates must be non-increasing (unconditional P(draft i accepted)): "
                f"position {position + 1} rate {values[position]} > position {position} "
                f"rate {values[position - 1]}"
            )
    return values


def unconditional_to_conditional(rates: Sequence[float]) -> list[float]:
    """c_i = P(draft i accepted | drafts before it accepted) = r_i / r_{i-1}; 0 after a zero rate."""
    values = validate_rates(rates, len(rates))
    conditional = []
    previous = 1.0
    for rate in values:
        conditional.append(rate / previous if previous > 0 else 0.0)
        previous = rate
    return conditional


def conditional_to_unconditional(conditional: Sequence[float]) -> list[float]:
    """r_i = c_1 * ... * c_i."""
    rates = []
    running = 1.0
    for position, c in enumerate(conditional, start=1):
        c = float(c)
        if not (math.isfinite(c) and 0 <= c <= 1):
            raise CurveError(f"conditional rates: position {position} rate {c} outside [0, 1]")
        running *= c
        rates.append(running)
    return rates
