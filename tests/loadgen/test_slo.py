"""SLOs (loadgen/results/slo.py) and what a level attains against them (loadgen/results/attainment.py): parsing
with errors that name the bound, good requests, attainment with its clustered interval, goodput
and the bounds broken most, from known per-request values; and every level of a real replay
carries its `slo` block."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.results.attainment import ClusterSums, SloTally, level_attainment, wilson
from loadgen.results.slo import TIERS, SloError, parse_slo, parse_slos


def test_a_tier_and_a_spec_parse_to_bounds_in_the_columns_units():
    standard = parse_slo("standard")
    assert standard.name == "standard" and standard.text == TIERS["standard"]
    slo = parse_slo("ttft<=500ms, e2el<=1.5s,norm_e2el<=800us,interactivity>=30tok/s")
    assert slo.name == slo.text == "ttft<=500ms,e2el<=1.5s,norm_e2el<=800us,interactivity>=30"
    assert [(b.metric, b.op, b.value) for b in slo.bounds] == [
        ("ttft", "<=", 500_000), ("e2el", "<=", 1_500_000), ("norm_e2el", "<=", 800), ("interactivity", ">=", 30)]
    assert len(TIERS) >= 3


@pytest.mark.parametrize(("text", "names"), [
    ("ttft<=2", "'ttft<=2': give the unit of ttft"),
    ("ttft>=2s", "'ttft>=2s': ttft takes an upper bound"),
    ("interactivity<=50", "'interactivity<=50': interactivity takes a lower bound"),
    ("speed>=5", "'speed>=5': unknown metric 'speed'"),
    ("ttft<=0s", "'ttft<=0s': the bound must be a positive"),
    ("ttft<=2s,ttft<=3s", "'ttft<=3s': a second bound on ttft"),
    ("ttft<=2s,,tpot<=1s", "an empty bound"),
    ("interactivity>=50ms", "'interactivity>=50ms': interactivity is in tokens/s/user"),
    ("ttft<=2s;tpot<=1s", "expected METRIC<=VALUE"),
    ("tpot<=0.5us", "'tpot<=0.5us': no request can meet it"),
    ("interactivity>=2e6", "'interactivity>=2e6': no request can meet it"),
    ("ttft<=infs", "'ttft<=infs'"),
    ("", "empty SLO"),
])
def test_bad_and_impossible_slos_name_the_bound(text, names):
    with pytest.raises(SloError) as info:
        parse_slo(text)
    assert names in str(info.value)


def test_the_same_slo_twice_is_an_error():
    with pytest.raises(SloError, match="'standard' is given twice"):
        parse_slos(["standard", "batch", "standard"])


def test_replay_refuses_a_bad_slo_naming_the_flag(replay_cli_error):
    code, err = replay_cli_error("--slo", "ttft<=2")
    assert code == 2 and "--slo: 'ttft<=2': give the unit of ttft" in err
    code, err = replay_cli_error("--attainment", "1.5")
    assert code == 2 and "--attainment: the target share of good requests must be in (0, 1]" in err


# -- attainment from known requests ---------------------------------------------------------

REQUESTS = {  # three plays; the second request breaks the TTFT bound, the fifth the interactivity one
    "play": [1, 1, 1, 2, 2, 3],
    "ttft_us": [1e6, 6e6, 1e6, 1e6, 1e6, 1e6],
    "tpot_us": [1e4, 1e4, None, 1e5, 1e4, 1e4],  # 100, 100, -, 10, 100, 100 tok/s
    "e2el_us": [2e6] * 6,
    "osl": [10, 10, 1, 10, 10, 30],
}


def test_attainment_goodput_and_violations_from_known_requests():
    # play 3 also had a failed request: never good, and its play is not all good
    entry = level_attainment(parse_slo("standard"), REQUESTS, [3], window_s=10.0, gpus=2, target=0.5)
    assert entry["name"] == "standard" and entry["target"] == 0.5
    req = entry["requests"]
    assert (req["total"], req["good"]) == (7, 4)  # 6 measured + 1 failed; the request with no TPOT is good
    assert req["attainment"] == pytest.approx(4 / 7, abs=1e-6)
    low, high = req["interval"]
    assert low < 4 / 7 < high
    assert req["met"] is None  # the interval straddles 0.5
    assert entry["sessions"]["total"] == 3 and entry["sessions"]["good"] == 0
    assert entry["violations"] == {"ttft<=5s": 1, "interactivity>=20": 1, "error": 1}
    assert entry["worst"] == "ttft<=5s"  # ties go to the first bound
    good_tokens = 10 + 1 + 10 + 30  # requests 1, 3, 5, 6
    assert entry["goodput"] == {"requests_per_s": 0.4, "output_tokens_per_s": good_tokens / 10,
                                "requests_per_s_per_gpu": 0.2, "output_tokens_per_s_per_gpu": good_tokens / 20}


def test_the_interval_counts_plays_as_clusters():
    # 20 plays of 10 requests: 15 plays all good, 5 all bad. As independent requests Wilson would
    # take n = 200; the plays move together, so the effective number is the number of plays.
    good = np.array([10] * 15 + [0] * 5)
    total = np.full(20, 10)
    share = ClusterSums.of(good, total).share()
    assert share.value == 0.75 and share.effective == pytest.approx(20)
    assert (share.low, share.high) == pytest.approx(wilson(15, 20))
    # the same share spread evenly over the plays: no clustering to speak of, n stays the requests'
    even = ClusterSums.of(np.array([7, 8] * 10), total).share()
    assert even.value == 0.75 and even.effective == pytest.approx(200)


def _bunched_requests() -> dict[str, list]:
    """40 plays of 5 requests, one every 2 s per play over 10 s, each lasting 1 s; every request
    that starts in the fifth or sixth second is slow, whichever play it belongs to."""
    plays = np.repeat(np.arange(40), 5)
    start_ms = (np.tile(np.arange(5) * 2000, 40) + np.repeat(np.arange(40) * 50 % 2000, 5)).astype(float)
    slow = (start_ms >= 4000) & (start_ms < 6000)
    return {"play": plays.tolist(), "start_ms": start_ms.tolist(), "ttft_us": [100_000] * 200,
            "tpot_us": np.where(slow, 100_000, 10_000).tolist(), "e2el_us": [1_000_000] * 200, "osl": [10] * 200}


def test_failures_bunched_in_time_across_plays_count_as_one_cluster():
    # 1 of each play's 5 requests fails, so clustering by play sees no clumping, but in time it is
    # one cluster of 40 failures among 10 one-second blocks.
    requests = _bunched_requests()
    entry = level_attainment(parse_slo("interactive"), requests, [], window_s=10.0, gpus=1)["requests"]
    assert (entry["total"], entry["good"]) == (200, 160)
    assert entry["effective_n"] < 20  # not the ~200 that play clusters would give
    without_time = {k: v for k, v in requests.items() if k != "start_ms"}
    by_play = level_attainment(parse_slo("interactive"), without_time, [], window_s=10.0, gpus=1)["requests"]
    assert by_play["effective_n"] == pytest.approx(200)
    assert entry["interval"][1] - entry["interval"][0] > 2 * (by_play["interval"][1] - by_play["interval"][0])


def test_a_level_of_one_play_is_clustered_in_time_alone():
    # a Mooncake trace is replayed as one play: 240 requests over 8 s, 3 slow ones spread out in time.
    # One cluster measures no spread, so the play clustering must not count the level as one draw
    n = 240
    start_ms = np.arange(n) * (8000 / n)
    slow = np.isin(np.arange(n), [10, 120, 230])
    requests = {"play": [7] * n, "start_ms": start_ms.tolist(), "ttft_us": [100_000] * n,
                "tpot_us": np.where(slow, 100_000, 10_000).tolist(), "e2el_us": [100_000] * n, "osl": [4] * n}
    entry = level_attainment(parse_slo("interactive"), requests, [], window_s=8.0, gpus=1)["requests"]
    assert (entry["total"], entry["good"]) == (n, n - 3)
    assert entry["effective_n"] > 100 and entry["met"] is True  # 16 blocks of 0.5 s, failures in 3 of them
    tally = SloTally(parse_slo("interactive"))
    for i in range(n):
        tally.add(7, *(requests[k][i] for k in ("ttft_us", "e2el_us", "tpot_us", "osl", "start_ms")))
    share = tally.sums().share()
    assert share.effective == pytest.approx(entry["effective_n"], abs=0.01)
    without_time = {k: v for k, v in requests.items() if k != "start_ms"}
    alone = level_attainment(parse_slo("interactive"), without_time, [], window_s=8.0, gpus=1)["requests"]
    assert alone["effective_n"] == 1.0  # nothing but the one play to go by: one draw


def test_the_live_tally_clusters_in_time_as_the_summary_and_adds_across_workers():
    # the capacity search's early stop must not stop on a burst the summary would call undecided:
    # the running tally, split over two workers by play, gives the summary's interval
    slo, requests = parse_slo("interactive"), _bunched_requests()
    tallies = [SloTally(slo), SloTally(slo)]
    for i, play in enumerate(requests["play"]):
        tallies[play % 2].add(play, *(requests[k][i] for k in ("ttft_us", "e2el_us", "tpot_us", "osl", "start_ms")))
    tallies[1].add_error(41)
    share = (tallies[0].sums() + tallies[1].sums()).share()
    entry = level_attainment(slo, requests, [41], window_s=10.0, gpus=1)["requests"]
    assert (share.total, share.good) == (entry["total"], entry["good"]) == (201, 160)
    assert share.effective == pytest.approx(entry["effective_n"], abs=0.01) and share.effective < 20
    assert [share.low, share.high] == pytest.approx(entry["interval"], abs=1e-6)


def test_an_all_good_level_counts_at_its_requests_and_sums_add_across_workers():
    sums = ClusterSums.of(np.array([5, 5]), np.array([5, 5])) + ClusterSums.of(np.array([90]), np.array([90]))
    share = sums.share()
    assert (share.total, share.good, share.effective) == (100, 100, 100)
    assert share.low == pytest.approx(wilson(100, 100)[0]) and share.high == 1.0
    assert share.verdict(0.95) is True and share.verdict(0.99) is None
    assert ClusterSums().share().value is None


def test_the_live_tally_judges_as_the_summary_does():
    slo = parse_slo("standard")
    tally = SloTally(slo)
    for i, play in enumerate(REQUESTS["play"]):
        tally.add(play, REQUESTS["ttft_us"][i], REQUESTS["e2el_us"][i], REQUESTS["tpot_us"][i], REQUESTS["osl"][i],
                  start_ms=1000.0 * i)
    tally.add_error(3)
    share = tally.sums().share()
    entry = level_attainment(slo, REQUESTS, [3], 10.0, 1)
    assert (share.total, share.good) == (entry["requests"]["total"], entry["requests"]["good"])
    assert [share.low, share.high] == pytest.approx(entry["requests"]["interval"], abs=1e-6)


def test_wilson_is_the_score_interval():
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(3.8415 / (10 + 3.8415), rel=1e-4)
    low, high = wilson(5, 10)
    assert 0.5 - low == pytest.approx(high - 0.5) and math.isclose(low, 0.2366, abs_tol=1e-4)


def test_every_level_of_a_replay_reports_each_slo(start_server, sessions, replay):
    server = start_server(first_ms=20, itl_ms=5)  # TPOT 5 ms: 200 tok/s/user
    folder = sessions({"n_requests": 6, "think": 0.01})
    code, doc, records = replay(server.url, "--traces", str(folder), "--duration", "1.5", "--think-time-scale", "0",
                                "--slo", "ttft<=10ms,interactivity>=100", "--slo", "ttft<=1s")
    assert code == 0
    assert doc["config"]["slos"] == [{"name": "ttft<=10ms,interactivity>=100", "spec": "ttft<=10ms,interactivity>=100"},
                                     {"name": "ttft<=1s", "spec": "ttft<=1s"}]
    level = doc["levels"][0]
    strict, loose = level["slo"]
    ok = level["counts"]["requests_ok"]
    assert ok > 0 and strict["requests"]["good"] == 0 and strict["violations"]["ttft<=10ms"] == ok
    assert loose["requests"]["good"] == ok and loose["requests"]["attainment"] == 1.0
    assert loose["goodput"]["requests_per_s"] == pytest.approx(ok / level["window_s"], rel=1e-3)
    assert level["failed_plays"] == []


def test_a_replay_without_slo_reports_every_tier(start_server, sessions, replay):
    server = start_server(first_ms=1, itl_ms=1)
    code, doc, _ = replay(server.url, "--traces", str(sessions({"n_requests": 3, "think": 0.01})), "--duration", "0.5")
    assert code == 0
    assert [entry["name"] for entry in doc["levels"][0]["slo"]] == list(TIERS)
