"""The capacity search (loadgen/capacity/): probe-then-bisect on known attainment curves, the
interval read off the curve, early stops, and `loadgen capacity` end to end against a real server
whose speed falls with its load in a known way (tests/loadgen/sse_server.py `itl_per_user`)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from loadgen.capacity.config import SearchConfig
from loadgen.capacity.describe import describe_capacity
from loadgen.capacity.dispersion import Calibration, calibrate, non_increasing
from loadgen.capacity.search import CapacitySearch, Probe, capacity_from_curve
from loadgen.results.attainment import ClusterSums, LiveSums, Share, wilson
from loadgen.results.slo import parse_slo

SLO = parse_slo("standard")


def probe(load: float, good: int, total: int) -> Probe:
    low, high = wilson(good, total)
    return Probe(load, Share(total, good, low, high, float(total)), f"conc {load:g}", 10.0)


def run_search(curve, total: int = 400, **settings) -> CapacitySearch:
    """The search against a server whose attainment at load c is curve(c), measured on `total` requests."""
    search = CapacitySearch(SearchConfig(slo=SLO, **settings))
    while (step := search.next_probe()) is not None:
        search.observe(probe(step.load, round(curve(step.load) * total), total))
    return search


def test_a_step_curve_is_found_exactly_in_few_probes():
    search = run_search(lambda c: 1.0 if c <= 13 else 0.0)
    assert [p.load for p in search.probes] == [1, 2, 4, 8, 16, 12, 14, 13]
    found = search.result(gpus=2)
    assert (found["capacity"], found["low"], found["high"]) == (13, 13, 13)
    assert found["per_gpu"]["capacity"] == 6.5 and found["unit"] == "agents"
    assert not found["below_range"] and not found["above_range"]


def test_a_gradual_curve_puts_the_answer_inside_the_interval():
    # attainment falls 1 % per agent: 95 % is reached at exactly 5 agents
    search = run_search(lambda c: 1.0 - 0.01 * c, total=2000)
    found = search.result()
    assert found["low"] <= 5 <= found["high"] and found["capacity"] == 5
    assert found["high"] - found["low"] <= 4
    assert len(search.probes) <= search.config.max_probes


def test_an_undecided_end_sends_the_search_one_step_out():
    # at 8 the share is just under the target on few requests: not decisively failed, so the
    # search tries 9 (decisively failed) before it stops
    shares = {1: 1.0, 2: 1.0, 4: 1.0, 8: 0.94, 9: 0.5, 16: 0.0, 12: 0.0, 10: 0.0, 6: 1.0, 7: 1.0}
    search = CapacitySearch(SearchConfig(slo=SLO))
    while (step := search.next_probe()) is not None:
        total = 50 if step.load == 8 else 400
        search.observe(probe(step.load, round(shares[int(step.load)] * total), total))
    loads = [p.load for p in search.probes]
    assert loads[:5] == [1, 2, 4, 8, 6] and 9 in loads
    found = search.result()
    assert found["low"] <= found["capacity"] <= found["high"]


def test_failing_at_the_lightest_load_and_holding_at_the_heaviest():
    below = run_search(lambda c: 0.2)
    assert [p.load for p in below.probes] == [1]
    found = below.result()
    assert found["below_range"] and found["capacity"] is None
    assert "below the lightest load probed (1 agents failed)" in describe_capacity(found)
    above = run_search(lambda c: 1.0, high=32)
    assert [p.load for p in above.probes] == [1, 2, 4, 8, 16, 32]
    found = above.result()
    assert found["above_range"] and found["capacity"] is None and found["high"] is None
    assert "at least 32 agents" in describe_capacity(found)


def test_open_loop_search_bisects_rates_geometrically():
    search = run_search(lambda r: 1.0 if r <= 3.3 else 0.0, mode="poisson", low=0.5, high=100)
    loads = [p.load for p in search.probes]
    assert loads[:4] == [0.5, 1.0, 2.0, 4.0]
    found = search.result()
    assert found["unit"] == "requests/s"
    assert found["low"] <= 3.3 <= found["high"] * 1.1 and loads[-1] / loads[-2] != 2


def test_the_curve_is_made_non_increasing():
    fitted = non_increasing(np.array([1.0, 0.9, 0.95, 0.5]), np.array([1.0, 1.0, 1.0, 1.0]))
    assert fitted.tolist() == pytest.approx([1.0, 0.925, 0.925, 0.5])
    probes = [probe(1, 100, 100), probe(2, 90, 100), probe(3, 96, 100), probe(4, 10, 100)]
    found = capacity_from_curve(probes, 0.95, integer=True)
    assert found["capacity"] == 1  # the noisy 96 % at 3 pools with the 90 % at 2


def test_a_light_probe_with_few_requests_does_not_widen_the_interval():
    # a CPU run of `loadgen bench --capacity`: the lightest probes measured few requests, so their
    # intervals are wide; probes at 6 and 7 show the SLO held, 9 that it failed
    measured = [(1, 10, 10), (2, 49, 49), (4, 60, 61), (6, 115, 115), (7, 101, 101), (8, 146, 154), (9, 84, 113)]
    found = capacity_from_curve([probe(c, good, total) for c, good, total in measured], 0.95, integer=True)
    assert (found["capacity"], found["low"], found["high"]) == (7, 7, 8)


def clustered(load: float, good: int, total: int, effective: float) -> Probe:
    low, high = wilson(good / total * effective, effective)
    return Probe(load, Share(total, good, low, high, effective), f"conc {load:g}", 15.0)


def test_probes_in_order_call_for_no_correction():
    probes = [probe(1, 100, 100), probe(2, 98, 100), probe(3, 90, 100)]
    assert calibrate([p.load for p in probes], [p.share for p in probes], 0.95) == Calibration(1.0, 1.0)
    found = capacity_from_curve(probes, 0.95, integer=True)
    assert found["consistent"] and (found["design_effect"], found["dispersion"]) == (1.0, 1.0)


def test_an_all_good_window_counts_at_the_clustering_its_neighbours_show():
    # a search whose failures come in bursts: its last window caught none, so on its own it counts
    # at every request and looks decisive
    measured = [(16, 202, 207, 97.08), (32, 341, 356, 75.17), (64, 114, 186, 20.5), (48, 358, 379, 44.05),
                (40, 359, 381, 51.78), (36, 312, 332, 23.6), (34, 363, 363, 363.0)]
    probes = [clustered(*m) for m in measured]
    assert probes[-1].share.verdict(0.95) is True
    calibration = calibrate([p.load for p in probes], [p.share for p in probes], 0.95)
    near = [m for m in measured if m[1] >= 0.9 * m[2] and m[1] < m[2]]  # 64's saturated window is left out
    design = sum(m[2] for m in near) / sum(m[3] for m in near)
    assert calibration.design_effect == pytest.approx(design) and design > 5
    assert calibration.effective(probes[-1].share) == pytest.approx(363 / design)
    assert calibration.share(probes[-1].share).verdict(0.95) is None
    found = capacity_from_curve(probes, 0.95, integer=True)
    assert found["low"] is None and found["high"] == 63 and found["capacity"] == 35


def bursty_search(**settings) -> CapacitySearch:
    """A search against a server whose failures near its capacity come in bursts of 16 requests:
    0.45 requests a second per agent; every request good up to 66 agents, 96 % up to 76, 92 % up to
    84, 40 % beyond; a window with failures counts as one draw per 16 requests, one without none."""
    search = CapacitySearch(SearchConfig(slo=SLO, low=16, window_s=15.0, **settings))
    while (step := search.next_probe()) is not None:
        window = 15.0 if step.window_s is None else step.window_s
        load, total = step.load, round(0.45 * step.load * window)
        share = 1.0 if load <= 66 else 0.96 if load <= 76 else 0.92 if load <= 84 else 0.4
        good = round(share * total)
        effective = float(total) if good == total else total / 16
        low, high = wilson(good / total * effective, effective)
        search.observe(Probe(load, Share(total, good, low, high, effective), f"conc {load:g}", window))
    return search


def test_a_probe_sent_to_show_the_held_end_runs_long_enough_to_show_it():
    # the all-good windows below the bracket count at the bursts' design effect: one window each
    # shows nothing held, however far down the search steps; a confirming probe's longer window does
    one_window = bursty_search(confirm_windows=1)
    assert one_window.result()["low"] is None
    assert all(p.window_s == 15.0 for p in one_window.probes)
    search = bursty_search()
    confirming = [p for p in search.probes if p.confirming]
    assert confirming and all(15.0 < p.window_s <= 4 * 15.0 for p in confirming)
    assert all(p.window_s == 15.0 for p in search.probes if not p.confirming)
    assert [p.load for p in confirming] == [69, 63]  # one bracket step (10 %) down from 76, then from 69
    design = search.calibration().design_effect
    # long enough for 1.25 x z^2 t / (1 - t) draws of `design` requests each, at 0.45 requests a
    # second per agent
    needed = 1.25 * 1.959964 ** 2 * 0.95 / 0.05 * design * search.calibration().dispersion
    assert confirming[0].share.total == pytest.approx(min(needed, 0.45 * confirming[0].load * 60), rel=0.02)
    found = search.result()
    assert found["low"] is not None and found["low"] <= 76 <= found["high"]
    assert found["low"] <= found["capacity"] <= found["high"]
    assert found["low"] == max(p.load for p in confirming if p.share.good == p.share.total)
    assert "1 confirming over a longer window" not in describe_capacity(found)
    assert "2 confirming over a longer window" in describe_capacity(found)


def test_a_probe_failed_by_value_whose_interval_reaches_the_target_gives_the_clustering():
    # probes near the target all good (80) or failed by value beyond twice the allowed share, in
    # bursts, their interval still reaching the target (88): 80's all-good window must not count
    # at every request
    measured = [(16, 227, 227, 227.0), (32, 340, 340, 340.0), (64, 455, 455, 455.0), (128, 33, 218, 10.95),
                (96, 257, 390, 7.55), (80, 459, 459, 459.0), (88, 367, 448, 10.38)]
    probes = [clustered(*m) for m in measured]
    calibration = calibrate([p.load for p in probes], [p.share for p in probes], 0.95)
    assert calibration.design_effect == pytest.approx(448 / 10.38)  # 88's, not 96's (shown failed)
    found = capacity_from_curve(probes, 0.95, integer=True)
    assert found["low"] is None and found["high"] == 95
    # a window that caught one stray failure counts at no more draws than an all-good one
    stray = clustered(80, 458, 459, 459.0).share
    assert calibration.effective(stray) == pytest.approx(459 / calibration.design_effect)


def test_a_search_whose_windows_cannot_show_the_held_end_says_how_long_they_would_need():
    measured = [(16, 227, 227, 227.0), (32, 340, 340, 340.0), (64, 455, 455, 455.0), (128, 33, 218, 10.95),
                (96, 257, 390, 7.55), (80, 459, 459, 459.0), (88, 367, 448, 10.38)]
    short = CapacitySearch(SearchConfig(slo=SLO, low=16, window_s=15.0))
    long = CapacitySearch(SearchConfig(slo=SLO, low=16, window_s=60.0))
    for search in (short, long):
        for m in measured:
            search.observe(clustered(*m))
    # at 72 agents (one step below the bracket [80, 88]) at 80's request rate scaled down (of the
    # two probes as far away, the heavier), 1.25 x z^2 t / (1 - t) draws of 88's design effect take
    # longer than four 15 s windows, and fit in four of 60 s
    needed = 1.25 * 1.959964 ** 2 * 0.95 / 0.05 * (448 / 10.38) / (459 / 15.0 * 72 / 80)
    assert short.held_window_s(72) == pytest.approx(needed)
    assert short.next_probe() is None
    step = long.next_probe()
    assert step is not None and step.load == 72 and step.window_s == pytest.approx(needed)
    found = short.result()
    assert found["held_window_s"] == pytest.approx(short.held_window_s(found["capacity"]), abs=0.1)
    text = describe_capacity(found)
    assert f"would need a window of about {found['held_window_s']:.0f} s" in text


def test_disagreeing_probes_widen_every_interval_by_their_dispersion():
    # 95 % and 99 % at 1 and 2 agents break the monotone curve: pooled at 97 %, chi-square 2 x
    # 100 x 0.02^2 / (0.97 x 0.03) on one degree of freedom (3 probes, 2 fitted values)
    probes = [probe(1, 95, 100), probe(2, 99, 100), probe(3, 10, 100)]
    calibration = calibrate([p.load for p in probes], [p.share for p in probes], 0.95)
    phi = 2 * 100 * 0.02 ** 2 / (0.97 * 0.03)
    assert calibration == Calibration(pytest.approx(1.0), pytest.approx(phi))
    assert calibration.effective(probes[1].share) == pytest.approx(100 / phi)
    twice = [probe(5, 97, 100).share, probe(5, 99, 100).share]  # one load measured twice disagrees too
    assert calibrate([5, 5], twice, 0.95).dispersion > 1


def test_probes_that_contradict_each_other_even_so_are_flagged_and_spanned():
    # many mild disagreements share the degrees of freedom, so the dispersion stays too small to
    # reconcile one pair far apart: 21 agents still shows a failure and 22 a hold
    probes = [probe(c, 980 if c % 2 else 982, 1000) for c in range(1, 21)]
    probes += [probe(21, 900, 1000), probe(22, 990, 1000), probe(30, 500, 1000)]
    found = capacity_from_curve(probes, 0.95, integer=True)
    assert not found["consistent"] and (found["low"], found["high"]) == (20, 22)
    assert found["low"] <= found["capacity"] <= found["high"]
    assert "contradict" in describe_capacity({**found, "slo": {"name": "s", "spec": "s"}, "target": 0.95,
                                              "over": "requests", "unit": "agents", "gpus": 1,
                                              "per_gpu": {"capacity": None},
                                              "probes": [{"load": p.load, "stopped_early": None} for p in probes]})


def test_early_stop_looks_three_times_and_only_when_decided():
    search = CapacitySearch(SearchConfig(slo=SLO))
    all_bad = LiveSums(ClusterSums.of(np.zeros(30), np.full(30, 2)))
    assert search.early_verdict(all_bad, 0, window_elapsed_s=2, duration_s=10) is None  # before 25 %
    reason = search.early_verdict(all_bad, 4, window_elapsed_s=2.6, duration_s=10)
    assert reason is not None and "at most" in reason and "4 in flight as good" in reason
    assert search.early_verdict(all_bad, 4, window_elapsed_s=3, duration_s=10) is None  # one look per quarter
    fresh = CapacitySearch(SearchConfig(slo=SLO))
    few_good = LiveSums(ClusterSums.of(np.full(10, 2), np.full(10, 2)))
    assert fresh.early_verdict(few_good, 0, 2.6, 10) is None  # under min_requests
    many_good = LiveSums(ClusterSums.of(np.full(200, 2), np.full(200, 2)))
    assert "at least" in fresh.early_verdict(many_good, 3, 5.1, 10)
    off = CapacitySearch(SearchConfig(slo=SLO, early_stop=False))
    assert off.early_verdict(all_bad, 0, 2.6, 10) is None


# -- end to end ------------------------------------------------------------------------------


def capacity_cli(tmp_path, url: str, *flags: str) -> tuple[int, dict]:
    from loadgen.cli import main
    from loadgen.results.file import read_results

    out = tmp_path / "capacity"
    code = main(["capacity", "--url", url, "--out", str(out), "--quiet", *flags])
    return code, read_results(out / "result.json")


def shared_speed_capacity(start_server, sessions, tmp_path, n_requests: int, duration_s: float) -> tuple[int, dict]:
    """`loadgen capacity` against a server whose speed its sessions share. Each chunk waits 25 ms
    per session in flight: at n agents (no think time) TPOT is 25 n ms. tpot <= 137 ms holds up
    to 5 agents and fails from 6 (150 ms): the capacity is 5, with a margin of 12 ms either side
    for a busy machine's timer lateness."""
    server = start_server(first_ms=2, itl_ms=25, itl_per_user=True)
    folder = sessions(*[{"n_requests": n_requests, "think": 0.0, "n_out": 4} for _ in range(10)])
    return capacity_cli(tmp_path, server.url, "--traces", str(folder), "--slo", "tpot<=137ms", "--think-time-scale",
                        "0", "--duration", f"{duration_s:g}", "--warmup", "1req", "--workers", "1")


@pytest.mark.slow
def test_capacity_of_a_server_whose_speed_is_shared_by_its_sessions(start_server, sessions, tmp_path):
    code, doc = shared_speed_capacity(start_server, sessions, tmp_path, n_requests=80, duration_s=12)
    assert code == 0
    found = doc["capacity"]
    # long windows: an all-good probe keeps enough requests to stay decisive when a busy host's
    # stalls raise the design effect the probes near the target show
    assert found["low"] <= 5 <= found["high"], found
    assert found["capacity"] in (4, 5)  # 4 when a busy machine's timers pushed a few of 5's requests over
    loads = [p["load"] for p in found["probes"]]
    assert loads[:4] == [1, 2, 4, 8] and 5 in loads and 6 in loads
    assert [level["concurrency"] for level in doc["levels"]] == loads
    assert any(p["stopped_early"] for p in found["probes"] if p["load"] >= 6)  # a saturated probe stops early
    # every probe plays its own plan, as a sweep's levels do (a play id holds its level's index in
    # its high bits): no lane goes on with the previous probe's sessions
    assert all(play >> 32 == index for index, level in enumerate(doc["levels"])
               for play in level["requests"]["play"])


@pytest.mark.slow
def test_a_confirming_probe_runs_its_longer_window_on_the_server(start_server, sessions, tmp_path):
    # 2 s windows hold too few requests for an all-good share to show tpot <= 137 ms held at 95 %
    # (held up to 5 agents): the search bisects to [5, 6], then sends a confirming probe one agent
    # down, whose window is sized to show it held, and the runner runs it
    code, doc = shared_speed_capacity(start_server, sessions, tmp_path, n_requests=200, duration_s=2)
    assert code == 0
    found = doc["capacity"]
    long = [(p, level) for p, level in zip(found["probes"], doc["levels"]) if p["confirming"]]
    assert long, found["probes"]
    probe, level = long[0]
    assert probe["window_s"] > 2.5
    assert probe["load"] < 6 and probe["window_s"] <= 4 * 2.0 + 0.1
    assert level["window_s"] == pytest.approx(probe["window_s"], abs=0.01)
    assert level["slo"][0]["requests"]["total"] > 2 * max(p["total"] for p in found["probes"] if p["window_s"] <= 2.5
                                                         and p["load"] == probe["load"])
    assert found["low"] is not None and found["low"] <= 5 <= found["high"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--low", "0"], "--low: must be > 0"),
    (["--low", "8", "--high", "4"], "--high: 4 is below --low 8"),
    (["--resolution", "1.5"], "--resolution: must be in (0, 1)"),
    (["--max-probes", "1"], "--max-probes: need at least 2"),
    (["--confirm-windows", "0.5"], "--confirm-windows: must be >= 1"),
    (["--slo", "interactivity<=3"], "--slo: 'interactivity<=3': interactivity takes a lower bound"),
])
def test_bad_search_flags_name_the_flag(flags, message, capsys, tmp_path):
    from loadgen.cli import main

    assert main(["capacity", "--out", str(tmp_path / "o"), "--quiet", *flags]) == 2
    assert message in capsys.readouterr().err


def test_an_slo_no_load_can_hold_is_one_clear_error(start_server, sessions, tmp_path, capsys):
    server = start_server(first_ms=30, itl_ms=1)
    folder = sessions({"n_requests": 40, "think": 0.0})
    code, doc = capacity_cli(tmp_path, server.url, "--traces", str(folder), "--slo", "ttft<=5ms,tpot<=1s",
                             "--duration", "1", "--think-time-scale", "0", "--workers", "1")
    assert code == 1
    assert doc["capacity"]["below_range"] and len(doc["capacity"]["probes"]) == 1
    err = capsys.readouterr().err
    assert "is not held even at the lightest load (1 agents: 0.0% good, target 95%)" in err
    assert "the bound broken most: ttft<=5ms" in err


@pytest.mark.slow
def test_a_recipe_compares_capacities_round_by_round(tmp_path, sessions):
    # the baseline's capacity is 2 agents (tpot <= 100 ms at 40 ms per session), the control's too;
    # the planted variant's chunks wait 80 ms per session: 1 agent, a 50 % loss. Bounds sit 20 ms from
    # both neighbouring levels so a busy CI host's scheduling stalls do not move a capacity
    from loadgen.cli import main
    from tests.loadgen.conftest import SERVER, write_recipe

    folder = sessions(*[{"n_requests": 80, "think": 0.0, "n_out": 4} for _ in range(10)])
    config = json.dumps({"port": 0, "first_ms": 2, "itl_ms": 40, "itl_per_user": True}).replace(
        '"port": 0', '"port": {port}')
    doc = {"name": "capacity", "server": {"kind": "command", "health_path": "/v1/models",
                                          "command": f"{sys.executable} {SERVER} --config '{config}'"},
           "workload": {"traces": str(folder), "think_time_scale": 0},
           "slos": {"snappy": "tpot<=100ms"},
           "sweep": {"capacity": {"slo": "snappy", "low": 1}, "duration_s": 2.0, "warmup": "1req", "repeats": 3},
           "variants": [{"name": "base"}, {"name": "again", "control": True},
                        {"name": "slower", "env": {"SSE_SERVER_CONFIG": '{"itl_ms": 80}'}}]}
    out = tmp_path / "out"
    assert main(["recipe", "run", str(write_recipe(tmp_path, doc)), "--out", str(out), "--quiet"]) == 0
    run = json.loads((out / "runs" / "base-r1" / "result.json").read_text())
    assert run["capacity"]["slo"] == {"name": "snappy", "spec": "tpot<=100ms"}
    slower = json.loads((out / "compare" / "slower-vs-base.json").read_text())
    assert slower["base"] == [2, 2, 2] and slower["new"] == [1, 1, 1]
    assert slower["verdict"] == "worse" and slower["delta_pct"] == pytest.approx(-50.0)
    again = json.loads((out / "compare" / "again-vs-base.json").read_text())
    assert again["new"] == [2, 2, 2] and again["verdict"] == "within noise"
    text = (out / "compare" / "slower-vs-base.txt").read_text()
    assert "capacity under SLO snappy (agents), per round:" in text and "-50.0 %" in text and "worse" in text


@pytest.mark.parametrize(("change", "message"), [
    ({"sweep": {"conc": [2], "capacity": {}}}, "sweep: give exactly one of sweep.conc, sweep.rates and sweep.capacity"),
    ({"sweep": {"capacity": {"slo": "nosuch"}}}, "sweep.capacity.slo: 'nosuch': expected METRIC<=VALUE"),
    ({"slos": {"fast": "ttft<=1"}}, "slos.fast: 'ttft<=1': give the unit of ttft"),
    ({"slos": {"fast": 3}}, "slos.fast: expected bounds as text"),
    ({"sweep": {"capacity": {"low": 8, "high": 4}}}, "sweep.capacity.high: 4.0 is below sweep.capacity.low 8.0"),
    ({"sweep": {"capacity": {"attainment": 0}}}, "sweep.capacity.attainment: the target share"),
    ({"sweep": {"capacity": {"over": "plays"}}}, "sweep.capacity.over: must be one of requests, sessions"),
])
def test_bad_capacity_recipes_name_the_key(change, message):
    from loadgen.recipe.schema import RecipeError, recipe_from_dict

    doc = {"name": "t", "server": {"kind": "url", "url": "http://127.0.0.1:9"}, "variants": [{"name": "a"}],
           "sweep": {"conc": [1]}, **change}
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(doc, "r.yaml")
    assert message in str(info.value)


def test_a_capacity_recipe_runs_loadgen_capacity_with_its_search_flags():
    from loadgen.recipe.runner import load_command
    from loadgen.recipe.schema import recipe_from_dict

    recipe = recipe_from_dict({"name": "t", "server": {"kind": "url", "url": "http://127.0.0.1:9"},
                               "slos": {"fast": "ttft<=1s"}, "variants": [{"name": "a"}],
                               "sweep": {"capacity": {"slo": "fast", "high": 64, "early_stop": False}}})
    argv = load_command(recipe, recipe.baseline, "http://127.0.0.1:9", __import__("pathlib").Path("o"), True)
    assert argv[3] == "capacity" and "--conc" not in argv
    assert argv[argv.index("--slo") + 1] == "fast=ttft<=1s" and argv[argv.index("--high") + 1] == "64.0"
    assert "--no-early-stop" in argv and "--low" not in argv


@pytest.mark.slow
def test_open_loop_capacity_of_a_timestamped_trace_is_a_multiple_of_its_rate(start_server, tmp_path):
    # 10 requests/s recorded; each chunk waits 10 ms per request in flight: a few times the
    # recorded rate saturates it, half of it never does. Long windows: the all-good probes near the
    # capacity keep enough requests to stay decisive when a busy host's stalls raise the design effect
    server = start_server(first_ms=2, itl_ms=10, itl_per_request=True)
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 300, "output_length": 4,
                                         "hash_ids": [i]}) + "\n" for i in range(1200)))
    code, doc = capacity_cli(tmp_path, server.url, "--traces", str(trace), "--slo", "tpot<=30ms", "--duration", "8",
                             "--low", "0.5", "--high", "16", "--workers", "1")
    assert code == 0
    found = doc["capacity"]
    assert found["mode"] == "mooncake" and found["unit"] == "x recorded rate"
    loads = [p["load"] for p in found["probes"]]
    assert loads[:3] == [0.5, 1.0, 2.0] and doc["levels"][1]["label"] == "mooncake x1"
    held = {p["load"]: p["holds"] for p in found["probes"]}
    assert held[0.5] and held[1.0] and not held[max(loads)]
    assert found["low"] is not None and found["high"] is not None and found["low"] <= found["capacity"] <= found["high"]
    assert 1.0 <= found["capacity"] < max(loads)


@pytest.mark.slow
def test_open_loop_capacity_of_sessions_is_a_poisson_rate(start_server, sessions, tmp_path):
    server = start_server(first_ms=2, itl_ms=10, itl_per_request=True)
    folder = sessions(*[{"n_requests": 40, "think": 0.0, "n_out": 4} for _ in range(6)])
    code, doc = capacity_cli(tmp_path, server.url, "--traces", str(folder), "--open-loop", "--slo", "tpot<=30ms",
                             "--duration", "3", "--low", "4", "--high", "64", "--workers", "1")
    assert code == 0
    found = doc["capacity"]
    assert found["mode"] == "poisson" and found["unit"] == "requests/s"
    assert [level["label"] for level in doc["levels"][:2]] == ["rate 4/s", "rate 8/s"]
    assert found["capacity"] is not None and 4 <= found["capacity"] < 64
