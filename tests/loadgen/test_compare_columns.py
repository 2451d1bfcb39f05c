"""The BASE and NEW columns of `loadgen compare` are the values its delta is computed from: with
paired rounds on matched requests, where the percentiles over all requests move the other way
(the slower run never finished the base run's slowest requests), the columns, the delta, its
centre and the verdict agree, the table says what the columns are and shows every round's change."""

from __future__ import annotations

import math

import pytest

from loadgen.compare import compare_runs, format_comparison, to_json, verdict
from loadgen.compare.verdicts import MetricResult
from loadgen.results.metric_registry import STATISTIC_BY_NAME

MATCHED = 200  # requests both runs of a round measured
E2EL_S = [0.5 + j / MATCHED for j in range(MATCHED)]  # their E2EL on the base side: p99 = 1.485 s
FACTORS = (1.58, 1.50, 1.66, 1.62)  # NEW / BASE of every matched request, round by round
LATE_S = 5.0  # E2EL of the requests only the base runs of rounds 3 and 4 measured
LATE = 20
COMPARED = [STATISTIC_BY_NAME["e2el_p50"], STATISTIC_BY_NAME["e2el_p99"]]


def _run(e2el_s: list[float]) -> dict:
    """A results doc of one level whose k-th request is turn k of session s0's only play."""
    n = len(e2el_s)
    e2el_us = [1e6 * e for e in e2el_s]
    return {"levels": [{
        "label": "conc 2", "failed": False, "window_s": 30.0, "throughput": {"gpus": 1},
        "requests": {"play": [0] * n, "session": ["s0"] * n, "agent": [""] * n, "turn": list(range(n)),
                     "ttft_us": [e / 10 for e in e2el_us], "tpot_us": [e / 100 for e in e2el_us], "e2el_us": e2el_us,
                     "osl": [100] * n, "isl": [1000] * n}}]}


def _sides() -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    base, new = [], []
    for k, factor in enumerate(FACTORS):
        late = [LATE_S] * LATE if k >= 2 else []
        base.append((f"base-{k}", _run(E2EL_S + late)))
        new.append((f"new-{k}", _run([e * factor for e in E2EL_S])))
    return base, new


def test_the_sides_percentiles_over_all_requests_move_the_other_way():
    """The case itself: over all requests NEW's E2EL p99 is below BASE's in rounds 3 and 4, and
    their mean too; over the requests both runs measured it is 50-66 % above in every round."""
    base, new = _sides()
    whole = compare_runs(base, new, COMPARED, resamples=100).levels[0].results[1]
    assert whole.new is not None and whole.base is not None and whole.new < whole.base


def test_paired_columns_are_the_values_the_delta_is_computed_from():
    base, new = _sides()
    comparison = compare_runs(base, new, COMPARED, resamples=100, paired=True)
    level = comparison.levels[0]
    assert level.method == "paired rounds, matched requests"
    p99 = level.results[1]
    assert p99.metric.name == "e2el_p99" and p99.verdict == "worse"
    assert p99.base is not None and p99.new is not None and p99.delta_pct is not None and p99.ci_pct is not None
    geomean = math.prod(FACTORS) ** (1 / len(FACTORS))
    assert p99.base == pytest.approx(1.485)  # the matched requests' p99 in every round
    assert p99.new == pytest.approx(1.485 * geomean)
    assert p99.delta_pct == pytest.approx(100 * (p99.new / p99.base - 1), rel=1e-9)
    assert p99.delta_pct == pytest.approx(100 * (geomean - 1))
    low, high = p99.ci_pct  # the delta is the interval's centre on the log scale
    assert math.log1p(p99.delta_pct / 100) == pytest.approx((math.log1p(low / 100) + math.log1p(high / 100)) / 2)
    assert p99.rounds_pct == pytest.approx(tuple(100 * (f - 1) for f in FACTORS))
    assert level.values.startswith("matched requests, geometric mean over rounds")

    text = format_comparison(comparison, [])
    assert "base, new: matched requests, geometric mean over rounds" in text
    assert "per round, %" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("E2EL p99"))
    shown_base, shown_new = (float(x) for x in row.split()[3:5])
    assert shown_new > shown_base  # the columns rise, as the "worse" says
    assert row.split()[5] == f"{p99.delta_pct:+.1f}%"
    assert "worse" in row and row.rstrip().endswith("+58.0 +50.0 +66.0 +62.0")

    doc = to_json(comparison, ["base"], ["new"], [])
    assert doc["levels"][0]["values"] == level.values
    p99_json = doc["levels"][0]["metrics"][1]
    assert p99_json["rounds_pct"] == pytest.approx([58.0, 50.0, 66.0, 62.0])
    assert p99_json["new"] / p99_json["base"] - 1 == pytest.approx(p99_json["delta_pct"] / 100, rel=1e-5)


def test_repeats_show_the_geometric_means_their_interval_is_centred_on():
    base, new = _sides()
    level = compare_runs(base, new, COMPARED, resamples=100).levels[0]
    assert level.method == "repeats" and level.values == "geometric mean over runs"
    p99 = level.results[1]
    assert p99.base == pytest.approx(math.sqrt(1.485 * LATE_S))
    assert p99.delta_pct == pytest.approx(100 * (p99.new / p99.base - 1), rel=1e-9)


def test_a_drop_is_never_labelled_worse():
    e2el = STATISTIC_BY_NAME["e2el_p99"]
    with pytest.raises(ValueError, match="E2EL p99: NEW 1.6 below BASE 1.7 but labelled worse"):
        MetricResult(e2el, 1.7, 1.6, 61.7, (19.8, 118.3), "worse")
    with pytest.raises(ValueError, match="labelled better"):
        MetricResult(STATISTIC_BY_NAME["request_rate"], 2.0, 1.0, -50.0, (-60.0, -40.0), "better")
    assert MetricResult(e2el, 1.7, 1.6, -5.9, (-8.0, -3.0), "better").verdict == "better"
    # an interval on the other side of 0 from its own estimate (a bootstrap's percentile interval
    # can be) is no evidence either way
    assert verdict(e2el, -2.0, (1.0, 5.0)) == "within noise"
