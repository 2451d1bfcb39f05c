"""Capacity verdicts: one variant's capacity under an SLO against the baseline's, round by round
(a recipe with `sweep.capacity`: every run is a `loadgen capacity` search).

Each round k gives a pair of capacities (the search's point estimates); the test is the one on
the per-round log ratios that the latency verdicts use (loadgen/compare/verdicts.py): paired,
or with the rounds as blocks when the recipe has more variants, whose ratios join the residual
variance. A capacity is known only to the search's resolution - it bisects until the bracket is
within `resolution` of the load that held, and a closed loop's answer is a whole number of agents
- so each capacity carries a quantisation error of up to one step, uniform: a variance of
log(1 + step)^2 / 12 each, where step is the larger of the resolution and one agent over the
capacity. That sum over the pair is the floor under the rounds' own variance: identical rounds
can never make a verdict out of a difference smaller than the search can see. A round whose
search found no capacity in its range (the SLO held at the heaviest load, or failed at the
lightest) gives no ratio and drops out; the result says so. Another variant whose search found
none in a round this pair has leaves the blocks rather than take that round from the pair.

Verdict: "better" when the 95 % interval of NEW / BASE - 1 lies above 0 (more agents), "worse"
when it lies below, else "within noise"; "n/a" with fewer than two usable rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.compare.significance import block_log_fit, t_test


@dataclass(frozen=True, slots=True)
class CapacityComparison:
    slo: str
    unit: str
    base: tuple[float | None, ...]  # per round
    new: tuple[float | None, ...]
    delta_pct: float | None
    ci_pct: tuple[float, float] | None
    p_value: float | None
    verdict: str
    rounds_used: int
    floor_pct: float | None  # the search's resolution alone, as a 95 % half-width in %

    def to_dict(self) -> dict[str, Any]:
        return {"slo": self.slo, "unit": self.unit, "base": list(self.base), "new": list(self.new),
                "delta_pct": self.delta_pct, "ci_pct": list(self.ci_pct) if self.ci_pct else None,
                "p_value": self.p_value, "verdict": self.verdict, "rounds_used": self.rounds_used,
                "floor_pct": self.floor_pct}


def capacity_of(doc: dict[str, Any]) -> float | None:
    """A run's capacity point estimate (None when its search found none in range)."""
    found = doc.get("capacity")
    return None if not found else found.get("capacity")


def compare_capacities(base: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]],
                       others: Sequence[Sequence[dict[str, Any]]] = ()) -> CapacityComparison:
    """Round k of each side (and of each other variant) measured together; results documents."""
    found = next(doc["capacity"] for doc in (*base, *new) if doc.get("capacity"))
    ratios = _log_ratios(base, new)
    # another variant joins the blocks only where it has every round this pair has: a round it
    # lacks would otherwise drop out of this pair's own comparison
    blocks = [block for other in others if len(other) == len(base)
              if np.isfinite((block := _log_ratios(base, other))[np.isfinite(ratios)]).all()]
    fit = block_log_fit(ratios, blocks)
    caps = [c for c in (*map(capacity_of, base), *map(capacity_of, new)) if c]
    floor = _floor_variance(caps, found.get("resolution", 0.1), found["unit"] == "agents")
    if fit is None:
        delta, ci, p, verdict, used = None, None, None, "n/a", int(np.isfinite(ratios).sum())
    else:
        diff, se, df, used = fit
        se = math.sqrt(se * se + floor / used)
        ci, p = t_test(diff, se, df)
        delta = 100.0 * math.expm1(diff)
        verdict = "within noise" if ci[0] <= 0.0 <= ci[1] else "better" if ci[0] > 0.0 else "worse"
    floor_pct = 100.0 * math.expm1(1.96 * math.sqrt(floor)) if floor else None
    return CapacityComparison(found["slo"]["name"], found["unit"], tuple(map(capacity_of, base)),
                              tuple(map(capacity_of, new)), delta, ci, p, verdict, used, floor_pct)


def _log_ratios(base: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> np.ndarray:
    out = np.full(min(len(base), len(new)), np.nan)
    for k, (b, n) in enumerate(zip(base, new)):
        cb, cn = capacity_of(b), capacity_of(n)
        if cb and cn:
            out[k] = math.log(cn / cb)
    return out


def _floor_variance(capacities: Sequence[float], resolution: float, whole_agents: bool) -> float:
    """The variance of a log ratio of two capacities from the search's quantisation alone."""
    if not capacities:
        return 0.0
    typical = float(np.median(capacities))
    step = max(resolution, 1.0 / typical) if whole_agents else resolution
    return 2.0 * math.log1p(step) ** 2 / 12.0


def format_capacity_comparison(result: CapacityComparison, base_name: str, new_name: str) -> str:
    """The per-round capacities and the verdict, as a text table."""
    lines = [f"capacity under SLO {result.slo} ({result.unit}), per round:",
             f"   {'round':<7}{base_name:>14}{new_name:>14}{'change':>10}"]
    for k, (b, n) in enumerate(zip(result.base, result.new), start=1):
        change = f"{100.0 * (n / b - 1):+.1f} %" if b and n else "-"
        lines.append(f"   {k:<7}{_cell(b):>14}{_cell(n):>14}{change:>10}")
    if result.delta_pct is None or result.ci_pct is None:
        lines.append(f"{new_name} vs {base_name}: n/a ({result.rounds_used} round(s) with a capacity on both sides; "
                     "need 2)")
        return "\n".join(lines)
    low, high = result.ci_pct
    floor = f"; the search's resolution alone: +-{result.floor_pct:.1f} %" if result.floor_pct else ""
    lines.append(f"{new_name} vs {base_name}: {result.delta_pct:+.1f} % [{low:+.1f}, {high:+.1f}], "
                 f"p {result.p_value:.3g}, {result.verdict} ({result.rounds_used} rounds{floor})")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "none in range" if value is None else f"{value:g}"
