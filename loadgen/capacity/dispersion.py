"""How much more a capacity search's probes disagree than their own intervals allow, and their
shares re-taken at an effective size that allows for it.

A probe's interval (loadgen/results/attainment.py) sees only its own window: the spread of its
requests between plays and between blocks of start time. Two cases escape it. A window where every
request was good (or none) shows no spread at all and counts at its number of requests, while the
probes around it show how strongly requests cluster. And failures that come in rare bursts (a long
prefill stalling every decode beside it) make one window's share swing with how many bursts it
happened to catch, a variance no single window can measure when it caught none or one. Both show
across probes: shares that break the rule that attainment cannot improve with more load, by more
than their intervals allow.

Two corrections follow, both taken from the probes themselves and both only ever widening:

- design effect: the probes near the target whose shares show spread give the pooled number of
  requests per effective draw (their requests over their effective numbers). Near: a bad share
  at most NEAR_TARGET times what the target allows, or an interval of its own that reaches the
  target (bursts one window cannot tell from the target's share); not a saturated probe shown
  failed, whose few good requests all came before the queue built up. A share with no spread
  counts at its requests over the design effect, and no share counts at more draws than that: a
  window that caught one stray failure shows no cluster of its own, and would otherwise count at
  nearly every request where an all-good window counts at few.
- dispersion: the shares' Pearson chi-square around their non-increasing fit (pool-adjacent-
  violators, weighted by the effective numbers above), per degree of freedom - the probes less the
  fit's distinct values (the effective degrees of freedom of an isotonic fit) - when above one.
  Every effective number is divided by it, as a quasi-binomial model scales its variance. Probes
  that are already in order leave no degrees of freedom and no correction: only disagreement
  counts as evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.results.attainment import Share, wilson

NEAR_TARGET = 2.0  # a probe informs the design effect when its bad share is at most this many times the allowed


@dataclass(frozen=True, slots=True)
class Calibration:
    """The corrections taken from a set of probes (module docstring); 1.0 each: none."""

    design_effect: float = 1.0
    dispersion: float = 1.0

    def effective(self, share: Share) -> float:
        """`share`'s effective number of draws after both corrections (at least one)."""
        pooled = share.total / self.design_effect
        base = min(share.effective, pooled) if 0 < share.good < share.total else pooled
        return max(1.0, base / self.dispersion)

    def share(self, share: Share) -> Share:
        """`share` with its interval re-taken at the corrected effective number."""
        if share.total == 0 or share.low is None:
            return share
        effective = self.effective(share)
        low, high = wilson(share.good / share.total * effective, effective)
        return Share(share.total, share.good, low, high, effective)

    def to_dict(self) -> dict[str, Any]:
        return {"design_effect": round(self.design_effect, 4), "dispersion": round(self.dispersion, 4)}


def calibrate(loads: Sequence[float], shares: Sequence[Share], target: float) -> Calibration:
    """The corrections for shares measured at `loads` against attainment `target` (empty shares
    are left out)."""
    measured = sorted(((load, s) for load, s in zip(loads, shares) if s.total and s.low is not None),
                      key=lambda pair: pair[0])
    near = 1 - NEAR_TARGET * (1 - target)
    spread = [s for _, s in measured if 0 < s.good < s.total
              and (s.good >= near * s.total or (s.high is not None and s.high >= target))]
    effective = sum(s.effective for s in spread)
    design = max(1.0, sum(s.total for s in spread) / effective) if spread and effective > 0 else 1.0
    first = Calibration(design_effect=design)
    weights = np.array([first.effective(s) for _, s in measured], dtype=np.float64)
    values = np.array([s.good / s.total for _, s in measured], dtype=np.float64)
    if len(values) < 2:
        return first
    fit = non_increasing(values, weights)
    freedom = len(values) - len(np.unique(fit))
    if freedom < 1:
        return first
    # a fit at 0 or 1 has no binomial variance: keep it half a draw inside, as Wilson's centre does
    inside = np.clip(fit, 0.5 / (weights + 1), 1 - 0.5 / (weights + 1))
    chi_square = float(np.sum(weights * (values - fit) ** 2 / (inside * (1 - inside))))
    return Calibration(design_effect=design, dispersion=max(1.0, chi_square / freedom))


def non_increasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-increasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values.tolist(), weights.tolist()):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            mean, weight_, count = blocks.pop()
            prev = blocks[-1]
            total = prev[1] + weight_
            prev[0] = (prev[0] * prev[1] + mean * weight_) / total
            prev[1], prev[2] = total, prev[2] + count
    return np.array([mean for mean, _, count in blocks for _ in range(int(count))], dtype=np.float64)
