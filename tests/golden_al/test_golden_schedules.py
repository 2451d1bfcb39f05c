"""Rate schedules from a mean AL, their validation, and conditional/unconditional conversions."""

from __future__ import annotations

import math

import pytest

from golden_al import (
    CurveError,
    conditional_to_unconditional,
    geometric_rates,
    min_variance_rates,
    schedule_rates,
    unconditional_to_conditional,
    validate_rates,
)


def test_min_variance_matches_the_vllm_example_exactly():
    assert min_variance_rates(3.51, 5) == [1.0, 1.0, 0.51, 0.0, 0.0]


@pytest.mark.parametrize(
    ("al", "k", "rates"),
    [
        (1.0, 3, [0.0, 0.0, 0.0]),
        (4.0, 3, [1.0, 1.0, 1.0]),
        (3.0, 4, [1.0, 1.0, 0.0, 0.0]),
        (1.79, 1, [0.79]),
        (2.58, 8, [1.0, 0.58, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_min_variance_edges(al, k, rates):
    assert min_variance_rates(al, k) == rates
    assert 1 + sum(rates) == pytest.approx(al, abs=1e-12)


@pytest.mark.parametrize("k", [1, 2, 5, 8])
@pytest.mark.parametrize("fraction", [0.0, 0.13, 0.5, 0.97, 1.0])
def test_geometric_rates_sum_to_the_al_with_a_constant_ratio(k, fraction):
    al = 1 + fraction * k
    rates = geometric_rates(al, k)
    assert len(rates) == k
    assert 1 + sum(rates) == pytest.approx(al, abs=1e-9)
    a = rates[0]
    assert rates == pytest.approx([a**i for i in range(1, k + 1)], abs=1e-12)
    validate_rates(rates, k)


def test_geometric_known_value():
    # 1 + a + a^2 = 1.75 has the root a = 0.5.
    assert geometric_rates(1.75, 2) == pytest.approx([0.5, 0.25], abs=1e-12)


@pytest.mark.parametrize("build", [min_variance_rates, geometric_rates])
@pytest.mark.parametrize(("al", "k"), [(0.99, 3), (4.01, 3), (2.5, 1), (math.nan, 2), (math.inf, 2)])
def test_al_outside_range_is_an_error(build, al, k):
    with pytest.raises(CurveError, match=r"outside \[1, "):
        build(al, k)


@pytest.mark.parametrize("k", [0, -1, 2.0, True])
def test_bad_k_is_an_error(k):
    with pytest.raises(CurveError, match="k must be an integer >= 1"):
        min_variance_rates(1.5, k)


def test_schedule_by_name():
    assert schedule_rates("min-variance", 3.51, 5) == min_variance_rates(3.51, 5)
    assert schedule_rates("geometric", 3.51, 5) == geometric_rates(3.51, 5)
    with pytest.raises(CurveError, match="unknown schedule 'flat'"):
        schedule_rates("flat", 3.51, 5)


@pytest.mark.parametrize(
    ("rates", "k", "message"),
    [
        ([0.5, 0.6], 2, r"non-increasing.*position 2 rate 0\.6 > position 1 rate 0\.5"),
        ([1.2, 0.5], 2, r"position 1 rate 1\.2 outside \[0, 1\]"),
        ([0.5, -0.1], 2, r"position 2 rate -0\.1 outside \[0, 1\]"),
        ([0.5, math.nan], 2, r"position 2 rate nan outside"),
        ([0.9, 0.5], 3, r"expected 3 values .*got 2"),
        ([0.9, 0.5, 0.1], 2, r"expected 2 values .*got 3"),
    ],
)
def test_validate_rates_errors(rates, k, message):
    with pytest.raises(ValueError, match=message):
        validate_rates(rates, k)


def test_validate_rates_accepts_a_schedule():
    assert validate_rates((1, 0.5, 0.5, 0), 4) == [1.0, 0.5, 0.5, 0.0]


def test_unconditional_to_conditional():
    assert unconditional_to_conditional([0.8, 0.4, 0.1]) == pytest.approx([0.8, 0.5, 0.25])
    # After a zero rate the later positions are never reached: defined as 0.
    assert unconditional_to_conditional([1.0, 0.51, 0.0, 0.0]) == [1.0, 0.51, 0.0, 0.0]
    with pytest.raises(CurveError, match="non-increasing"):
        unconditional_to_conditional([0.4, 0.8])


@pytest.mark.parametrize(
    "rates",
    [[1.0, 1.0, 0.51, 0.0, 0.0], geometric_rates(3.51, 5), [0.9, 0.9, 0.3], [0.0, 0.0], [0.7]],
)
def test_round_trip_from_unconditional(rates):
    assert conditional_to_unconditional(unconditional_to_conditional(rates)) == pytest.approx(rates, abs=1e-15)


def test_round_trip_from_conditional_without_zeros():
    conditional = [0.9, 0.8, 1.0, 0.3]
    assert unconditional_to_conditional(conditional_to_unconditional(conditional)) == pytest.approx(conditional)


def test_conditional_out_of_range_is_an_error():
    with pytest.raises(CurveError, match=r"conditional rates: position 2 rate 1\.5"):
        conditional_to_unconditional([0.5, 1.5])
