"""AcceptanceSampler: draws follow the schedule, and the empirical AL converges to the golden one."""

from __future__ import annotations

import numpy as np
import pytest

from golden_al import CurveError, list_curves, load_curve, schedule_rates
from golden_al.sampler import AcceptanceSampler

DRAWS = 100_000


def _all_points() -> list[tuple[str, str, int, float]]:
    return [
        (name, mode, k, al)
        for name in list_curves()
        for mode, points in load_curve(name).modes.items()
        for k, al in points.items()
    ]


@pytest.mark.parametrize("schedule", ["min-variance", "geometric"])
def test_empirical_al_within_one_percent_for_every_curve_k_and_mode(schedule):
    misses = []
    for index, (name, mode, k, al) in enumerate(_all_points()):
        sampler = AcceptanceSampler(schedule_rates(schedule, al, k), seed=index)
        accepted = sampler.sample_many(DRAWS)
        assert accepted.shape == (DRAWS,)
        assert accepted.min() >= 0 and accepted.max() <= k
        measured = accepted.mean() + 1
        if abs(measured - al) > 0.01 * al:
            misses.append(f"{name} {mode} k={k}: golden {al}, measured {measured:.4f}")
    assert not misses, misses


def test_min_variance_draws_take_only_the_two_neighbouring_counts():
    accepted = AcceptanceSampler([1, 1, 0.51, 0, 0], seed=1).sample_many(DRAWS)
    assert set(np.unique(accepted)) == {2, 3}
    assert (accepted == 3).mean() == pytest.approx(0.51, abs=0.01)


def test_per_position_unconditional_rates_are_reproduced():
    rates = [0.9, 0.7, 0.7, 0.2]
    accepted = AcceptanceSampler(rates, seed=2).sample_many(DRAWS)
    measured = [(accepted >= i).mean() for i in range(1, len(rates) + 1)]
    assert measured == pytest.approx(rates, abs=0.01)


def test_scalar_sample_matches_vectorised_distribution():
    sampler = AcceptanceSampler([0.8, 0.5, 0.2], seed=3)
    draws = np.array([sampler.sample() for _ in range(20_000)])
    assert draws.min() >= 0 and draws.max() <= 3
    assert draws.mean() + 1 == pytest.approx(sampler.expected_al, rel=0.02)


def test_same_seed_same_draws_and_edges():
    assert np.array_equal(
        AcceptanceSampler([0.6, 0.3], seed=7).sample_many(1000),
        AcceptanceSampler([0.6, 0.3], seed=7).sample_many(1000),
    )
    assert AcceptanceSampler([1.0, 1.0], seed=0).sample_many(100).tolist() == [2] * 100
    assert AcceptanceSampler([0.0, 0.0], seed=0).sample() == 0
    assert AcceptanceSampler([0.5], seed=0).sample_many(0).shape == (0,)


def test_invalid_rates_are_refused():
    with pytest.raises(CurveError, match="non-increasing"):
        AcceptanceSampler([0.2, 0.9], seed=0)
    with pytest.raises(ValueError, match="n must be >= 0"):
        AcceptanceSampler([0.5], seed=0).sample_many(-1)
