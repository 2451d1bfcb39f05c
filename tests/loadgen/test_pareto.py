"""Pareto selection on hand-made points: dominance, ties, failed levels, several files, the
InferenceX rule that a point shows on any frontier only if it is on the normalized one."""

from __future__ import annotations

from loadgen.results.pareto import NORMALIZED, Point, frontiers, non_dominated, pareto, sweep_points


def _p(name: str, tput: float, inter: float | None, e2el: float | None, norm: float | None, source: str = "") -> Point:
    return Point(source, int(name[1:]), name, tput, inter, e2el, norm)


def _names(points) -> list[str]:
    return sorted(p.label for p in points)


def test_a_dominated_point_leaves_the_frontier():
    a = _p("c1", 100, 50, 2.0, 40)
    b = _p("c2", 200, 40, 3.0, 30)
    c = _p("c3", 150, 30, 4.0, 20)  # below b on throughput and on every axis
    assert _names(non_dominated([a, b, c], "interactivity")) == ["c1", "c2"]
    assert _names(non_dominated([a, b, c], "e2el")) == ["c1", "c2"]  # lower E2EL is better


def test_equal_on_one_axis_better_on_the_other_dominates():
    a = _p("c1", 100, 50, 2.0, 40)
    b = _p("c2", 100, 60, 2.0, 40)
    assert _names(non_dominated([a, b], "interactivity")) == ["c2"]
    assert _names(non_dominated([a, b], "e2el")) == ["c1", "c2"]  # identical there: a tie keeps both


def test_exact_ties_both_stay():
    a = _p("c1", 100, 50, 2.0, 40)
    b = _p("c2", 100, 50, 2.0, 40)
    chosen = frontiers([a, b])
    assert all(_names(points) == ["c1", "c2"] for points in chosen.values())


def test_points_missing_an_axis_drop_out_of_that_axis_only():
    a = _p("c1", 100, None, 2.0, 40)  # no TPOT: single-token outputs
    b = _p("c2", 50, 30, 1.0, 50)
    assert _names(non_dominated([a, b], "interactivity")) == ["c2"]
    assert _names(non_dominated([a, b], "e2el")) == ["c1", "c2"]


def test_inferencex_rule_removes_points_off_the_normalized_frontier():
    # c2 has the best interactivity at its throughput but is dominated on the normalized axis.
    a = _p("c1", 100, 50, 2.0, 40)
    b = _p("c2", 90, 80, 1.5, 30)
    c = _p("c3", 200, 20, 5.0, 20)
    assert _names(non_dominated([a, b, c], "interactivity")) == ["c1", "c2", "c3"]
    chosen = frontiers([a, b, c])
    assert _names(chosen[NORMALIZED]) == ["c1", "c3"]
    assert _names(chosen["interactivity"]) == ["c1", "c3"]
    assert _names(chosen["e2el"]) == ["c1", "c3"]
    assert [p.label for p in chosen[NORMALIZED]] == ["c3", "c1"]  # by throughput, descending


def test_rule_never_promotes_a_point_dominated_on_its_own_axis():
    # c2 is on the normalized frontier but c3 (not on it) beats c2 on interactivity: c2 stays off.
    a = _p("c1", 300, 10, 9.0, 40)
    b = _p("c2", 100, 50, 2.0, 50)
    c = _p("c3", 110, 60, 1.0, 10)
    chosen = frontiers([a, b, c])
    assert _names(chosen[NORMALIZED]) == ["c1", "c2"]
    assert _names(chosen["interactivity"]) == ["c1"]


def _level(label: str, tput: float, inter_p50: float | None, e2el_p90_us: int, norm_p90_us: int,
           failed: bool = False) -> dict:
    return {"label": label, "failed": failed, "throughput": {"output_tokens_per_s_per_gpu": tput},
            "metrics": {"interactivity": {"stats": {"p50": inter_p50}},
                        "e2el": {"stats": {"p90": e2el_p90_us}},
                        "norm_e2el": {"stats": {"p90": norm_p90_us}}}}


def test_failed_levels_are_never_candidates():
    levels = [_level("conc 1", 50, 40, 1_000_000, 20_000),
              _level("conc 2", 500, 90, 500_000, 5_000, failed=True)]  # would dominate everything
    doc = pareto(levels)
    assert [p["level"] for p in doc["points"]] == [0]
    assert doc["tput_per_gpu_vs_interactivity_p50"] == [0]
    assert doc["tput_per_gpu_vs_e2el_p90"] == [0]
    assert doc["tput_per_gpu_vs_e2e_interactivity"] == [0]


def test_results_entry_converts_units():
    doc = pareto([_level("conc 1", 50, 40, 1_500_000, 20_000)])
    point = doc["points"][0]
    assert point["e2el_p90_us"] == 1_500_000
    assert point["e2e_interactivity"] == 50.0  # 1 / 20 ms per token


def test_several_files_share_one_frontier():
    run_a = [_level("conc 1", 50, 40, 1_000_000, 20_000), _level("conc 2", 90, 30, 1_500_000, 30_000)]
    run_b = [_level("conc 1", 60, 45, 900_000, 18_000), _level("conc 2", 80, 25, 2_000_000, 40_000)]
    points = sweep_points([("a", run_a), ("b", run_b)])
    assert len(points) == 4
    chosen = frontiers(points)
    assert sorted((p.source, p.label) for p in chosen[NORMALIZED]) == [("a", "conc 2"), ("b", "conc 1")]
    assert sorted((p.source, p.label) for p in chosen["interactivity"]) == [("a", "conc 2"), ("b", "conc 1")]
