"""The bootstrap behind `loadgen compare` on hand-made samples: percentiles, pairing, repeats,
verdict directions, undefined values."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.compare import (
    CompareError,
    LevelSample,
    RankedWeights,
    cluster_counts,
    compare_runs,
    play_keys,
    point_values,
    session_bootstrap,
    verdict,
)
from loadgen.results.metric_registry import STATISTIC_BY_NAME, STATISTICS


def _sample(ttft: list[float], plays: list[str], window_s: float = 10.0, osl: list[float] | None = None) -> LevelSample:
    ttft_a = np.array(ttft, dtype=float)
    osl_a = np.array(osl or [10.0] * len(ttft), dtype=float)
    e2el = ttft_a + 9 * 1000.0
    cols = {"ttft_us": ttft_a, "tpot_us": np.full(len(ttft), 1000.0), "e2el_us": e2el, "norm_e2el_us": e2el / osl_a,
            "osl": osl_a, "tokens": osl_a + 100, "ones": np.ones(len(ttft))}
    return LevelSample("conc 1", "x", False, np.array(plays, dtype=object), cols, window_s, 1)


@pytest.mark.parametrize("q", [1, 25, 50, 90, 99, 100])
def test_weighted_percentiles_are_nearest_rank(q):
    rng = np.random.default_rng(0)
    values = np.sort(rng.normal(size=101))
    weights = rng.integers(0, 4, size=(3, 101))
    weights[:, 0] = 1
    got = RankedWeights(values, weights).percentile(q)
    for row, w in enumerate(weights):
        expanded = np.repeat(values, w)
        assert got[row] == np.percentile(expanded, q, method="inverted_cdf")


def test_the_percentile_of_an_empty_draw_is_nan():
    values = np.array([1.0, 2.0])
    got = RankedWeights(values, np.array([[0, 0], [1, 1]])).percentile(50)
    assert np.isnan(got[0]) and got[1] == 1.0


def test_cluster_counts_draw_each_row_with_replacement():
    counts = cluster_counts(np.random.default_rng(1), 7, 500)
    assert counts.shape == (500, 7) and (counts.sum(axis=1) == 7).all()
    assert 0.9 < counts.mean(axis=0).min() and counts.mean(axis=0).max() < 1.1


def test_metric_values_and_units():
    sample = _sample([1000.0 * i for i in range(1, 11)], [f"s{i}#0" for i in range(10)])
    values = dict(zip((m.name for m in STATISTICS), point_values(sample, STATISTICS)))
    assert values["ttft_p50"] == 5.0  # ms, nearest rank of 1..10 ms
    assert values["ttft_p90"] == 9.0
    assert values["tpot_p50"] == 1.0 and values["interactivity_p50"] == 1000.0  # 1 / 1 ms
    assert values["output_tput_per_gpu"] == 10.0  # 100 tokens in 10 s
    assert values["request_rate"] == 1.0


def test_identical_runs_are_within_noise_with_a_zero_interval():
    ttft = list(np.random.default_rng(2).uniform(1000, 5000, 200))
    plays = [f"s{i % 40}#0" for i in range(200)]
    doc = {"levels": [_level(ttft, plays)]}
    result = compare_runs([("a", doc)], [("b", doc)], resamples=200)
    level = result.levels[0]
    assert level.method == "paired sessions"
    for r in level.results:
        assert r.delta_pct == 0.0 and r.ci_pct == (0.0, 0.0) and r.verdict == "within noise"


def test_a_shift_is_worse_for_latency_and_better_for_nothing():
    rng = np.random.default_rng(3)
    ttft = list(rng.uniform(1000, 5000, 400))
    plays = [f"s{i % 80}#0" for i in range(400)]
    base = {"levels": [_level(ttft, plays)]}
    new = {"levels": [_level([t * 1.10 for t in ttft], plays)]}
    result = compare_runs([("a", base)], [("b", new)], [STATISTIC_BY_NAME["ttft_p50"], STATISTIC_BY_NAME["ttft_p90"]],
                          resamples=300)
    for r in result.levels[0].results:
        assert r.delta_pct == pytest.approx(10.0, abs=0.5)
        assert r.ci_pct[0] > 0 and r.verdict == "worse"
        assert r.worse_by_pct == pytest.approx(r.delta_pct)


def test_runs_of_different_plays_are_resampled_apart():
    rng = np.random.default_rng(4)
    a = _sample(list(rng.uniform(1000, 2000, 100)), [f"a{i % 20}#0" for i in range(100)])
    b = _sample(list(rng.uniform(1000, 2000, 100)), [f"b{i % 20}#0" for i in range(100)])
    boot = session_bootstrap(a, b, STATISTICS, 256, np.random.default_rng(0))
    assert boot.method == "sessions" and "unpaired" in boot.detail
    assert boot.base.shape == (len(STATISTICS), 256)


def test_plays_match_by_session_and_order_not_by_play_id():
    # the same sessions, but the slow run's plays were numbered after fewer earlier plays
    fast = play_keys([40, 40, 41, 47], ["x", "x", "y", "x"])
    slow = play_keys([35, 36, 36, 44], ["x", "y", "y", "x"])
    assert list(fast) == ["x#0", "x#0", "y#0", "x#1"]
    assert list(slow) == ["x#0", "y#0", "y#0", "x#1"]


@pytest.mark.parametrize("metric, ci, expected", [
    ("ttft_p90", (2.0, 8.0), "worse"),
    ("ttft_p90", (-8.0, -2.0), "better"),
    ("interactivity_p50", (2.0, 8.0), "better"),
    ("output_tput_per_gpu", (-8.0, -2.0), "worse"),
    ("e2el_p90", (-1.0, 3.0), "within noise"),
    ("e2el_p90", (0.0, 3.0), "within noise"),
])
def test_verdict_directions(metric, ci, expected):
    assert verdict(STATISTIC_BY_NAME[metric], sum(ci) / 2, ci) == expected


def test_min_effect_calls_small_changes_noise():
    assert verdict(STATISTIC_BY_NAME["ttft_p50"], 1.5, (1.0, 2.0), min_effect_pct=3.0) == "within noise"
    assert verdict(STATISTIC_BY_NAME["ttft_p50"], 4.0, (3.5, 4.5), min_effect_pct=3.0) == "worse"


def test_undefined_values_give_no_verdict():
    doc = {"levels": [_level([1000.0, 2000.0], ["s#0", "t#0"])]}
    empty = {"levels": [_level([], [])]}
    result = compare_runs([("a", doc)], [("b", empty)], [STATISTIC_BY_NAME["ttft_p50"]], resamples=100)
    r = result.levels[0].results[0]
    assert r.new is None and r.delta_pct is None and r.verdict == "n/a"


def test_repeats_need_two_runs_on_each_side():
    doc = {"levels": [_level([1000.0, 2000.0], ["s#0", "t#0"])]}
    twice = {"levels": [_level([1000.0, 2000.0], ["s#0", "t#0"]), _level([1500.0, 2500.0], ["s#0", "t#0"])]}
    with pytest.raises(CompareError, match="at least 2 on each side"):
        compare_runs([("a", twice)], [("b", doc)], resamples=100)
    result = compare_runs([("a", twice)], [("b", twice), ("c", doc)], [STATISTIC_BY_NAME["ttft_p50"]], resamples=100)
    level = result.levels[0]
    assert level.method == "repeats" and level.detail == "2 vs 3 repeats"
    r = level.results[0]
    assert r.base == pytest.approx(1.5 ** 0.5) and r.new == pytest.approx(1.5 ** (1 / 3))  # geometric means


def test_no_common_level_is_an_error():
    a = {"levels": [_level([1000.0], ["s#0"])]}
    b = {"levels": [dict(_level([1000.0], ["s#0"]), label="conc 2")]}
    with pytest.raises(CompareError, match="no common levels: base has conc 1, new has conc 2"):
        compare_runs([("a", a)], [("b", b)], resamples=100)


def _level(ttft: list[float], plays: list[str]) -> dict:
    n = len(ttft)
    return {"label": "conc 1", "failed": False, "window_s": 10.0, "throughput": {"gpus": 1},
            "requests": {"play": list(range(n)), "session": [p.split("#")[0] for p in plays],
                         "ttft_us": ttft, "tpot_us": [1000.0] * n, "e2el_us": [t + 9000.0 for t in ttft],
                         "osl": [10] * n, "isl": [100] * n}}
