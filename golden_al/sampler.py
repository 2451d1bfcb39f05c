"""Synthetic acceptance: how many of k drafts a verify step accepts, drawn from a rate schedule.

Drafts are checked in order and the first rejection ends the step, so position i is tried only
if every earlier draft was accepted and then passes with the conditional probability
c_i = r_i / r_{i-1}. The expected accepted count is sum(r), i.e. AL - 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from golden_al.schedules import unconditional_to_conditional, validate_rates


class AcceptanceSampler:
    """Draws accepted-draft counts (0..k) for a schedule of unconditional rates r_1..r_k."""

    def __init__(self, rates: Sequence[float], seed: int | None = None) -> None:
        self.rates = validate_rates(rates, len(rates))
        self.conditional = np.asarray(unconditional_to_conditional(self.rates), dtype=np.float64)
        self._rng = np.random.default_rng(seed)

    @property
    def k(self) -> int:
        return len(self.rates)

    @property
    def expected_al(self) -> float:
        return 1.0 + sum(self.rates)

    def sample(self) -> int:
        """Accepted drafts for one verify step."""
        accepted = 0
        for c in self.conditional:
            if self._rng.random() >= c:
                break
            accepted += 1
        return accepted

    def sample_many(self, n: int) -> np.ndarray:
        """Accepted drafts for n independent verify steps, as an int64 array of length n."""
        if n < 0:
            raise ValueError(f"sample_many: n must be >= 0, got {n}")
        passes = self._rng.random((n, self.k)) < self.conditional
        # The accepted count is the length of the leading run of passes.
        return np.cumprod(passes, axis=1, dtype=np.int64).sum(axis=1)
