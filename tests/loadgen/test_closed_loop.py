"""Closed-loop semantics against a real streaming server: concurrency, think time, subagents,
salts of recycled sessions, warm-up exclusion, start offsets."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from loadgen.report.table import format_level


def _by_play(records: list[dict]) -> dict[int, list[dict]]:
    plays = defaultdict(list)
    for rec in records:
        plays[rec["play"]].append(rec)
    for recs in plays.values():
        recs.sort(key=lambda r: r["start_ns"])
    return plays


def test_concurrency_never_exceeds_the_session_trees(start_server, sessions, replay):
    server = start_server(first_ms=5, itl_ms=1)
    folder = sessions(*({"n_requests": 5, "think": 0.02, "subagent": {"t": 0.3, "n_requests": 3, "think": 0.0,
                                                                      "duration_s": 5.0}} for _ in range(6)))
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "3", "--duration", "1.5",
                                "--start-offset", "0:0")
    assert code == 0
    seen = server.records()
    assert seen["max_users"] <= 3  # distinct session plays in flight at once
    assert seen["max_inflight"] > 3  # ... while subagents push in-flight requests past N
    level = doc["levels"][0]
    assert level["counts"]["max_active_trees"] == 3
    assert level["counts"]["max_inflight_requests"] == seen["max_inflight"]


def test_think_time_is_respected_and_subagents_overlap_their_parent(start_server, sessions, replay):
    server = start_server(first_ms=2, itl_ms=1)
    # Subagent launched after the 2nd parent request, 5 s long: the parent does not wait for it.
    folder = sessions({"n_requests": 6, "think": 0.15, "n_out": 4,
                       "subagent": {"t": 0.35, "n_requests": 4, "think": 0.05, "duration_s": 5.0}})
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "1", "--duration", "2.5",
                                "--start-offset", "0:0")
    assert code == 0
    play = _by_play(records)[0]
    parent = [r for r in play if r["agent"] == ""]
    sub = [r for r in play if r["agent"] == "agent_x"]
    assert [r["turn"] for r in parent][:6] == [0, 1, 6, 7, 8, 9]  # file order: subagent requests are 2..5
    for before, after in zip(parent, parent[1:]):
        assert after["start_ns"] - before["end_ns"] >= 150_000_000  # recorded think time 0.15 s
    for before, after in zip(sub, sub[1:]):
        assert after["start_ns"] - before["end_ns"] >= 50_000_000
    assert len(sub) == 4
    # every subagent request runs while the parent's chain is still going
    assert sub[0]["start_ns"] >= parent[1]["end_ns"]
    # the parent keeps going while the subagent's chain runs
    assert any(sub[0]["start_ns"] < p["start_ns"] < sub[-1]["end_ns"] for p in parent)


@pytest.mark.parametrize("think", [0.0, 0.2])
def test_mean_inflight_is_the_lanes_busy_share(start_server, sessions, replay, think):
    """Requests in flight averaged over the window: with a request taking ~110 ms (50 ms to the
    first token, 6 more 10 ms apart) and `think` s between requests, each of 2 lanes has one in
    flight at most latency / (latency + think) of the time (the client's own gaps between requests
    only lower it); without think time, nearly all of it. The same time summed from the
    per-request records, each clipped to the window, agrees."""
    server = start_server(first_ms=50, itl_ms=10)
    folder = sessions(*({"n_requests": 40, "think": think, "n_out": 7} for _ in range(2)))
    before = time.time()
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "2", "--duration", "2.5",
                                "--start-offset", "0:0", "--warmup", "1req")
    assert code == 0
    level = doc["levels"][0]
    # after the warm-up request (50 ms at least), and the window closed before the run ended
    assert before + 0.05 < level["window_start_unix"] < time.time() - level["window_s"]
    e2el = level["requests"]["e2el_us"]
    latency = sum(e2el) / len(e2el) / 1e6  # the server's known delays plus the loopback's
    assert 0.11 <= latency < 0.25
    ideal = 2 * latency / (latency + think)
    mean = level["counts"]["mean_inflight_requests"]
    assert 0.85 * ideal <= mean <= min(2, 1.03 * ideal)  # never more than the lanes
    # window start from the first counted request (records and columns are both in completion order)
    counted = [r for r in records if r["counted"]]
    start = counted[0]["start_ns"] - level["requests"]["start_ms"][0] * 1e6
    end = start + level["window_s"] * 1e9
    inside = sum(max(0.0, min(r["end_ns"], end) - max(r["start_ns"], start)) for r in records)
    assert mean == pytest.approx(inside / (end - start), rel=0.03)  # records start on the wire, a little later
    line = f"in flight: {mean:.2f} requests on average over the window ({mean / 2:.1%} of the lanes' time at conc 2"
    assert line in format_level(level)


def test_server_kernel_compiles_in_the_window_are_reported(start_server, sessions, replay):
    """A server whose `agentload:kernel_compiles_total` grows by 2 per finished request: the level
    reports the growth from window start to after the drain (2 per counted request: the one lane's
    warm-up request had finished when the window opened) and the table warns."""
    server = start_server(first_ms=5, kernel_compiles=2)
    # think time 0.3 s: the window-start scrape lands before the first counted request is even sent
    folder = sessions({"n_requests": 30, "think": 0.3, "n_out": 3})
    code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "1", "--duration", "1.5",
                          "--start-offset", "0:0", "--warmup", "1req")
    assert code == 0
    level = doc["levels"][0]
    assert level["counts"]["server_kernel_compiles"] == 2 * level["counts"]["requests_ok"] > 0
    assert f"WARNING: the server compiled {2 * level['counts']['requests_ok']} Triton kernel(s)" in format_level(level)
    quiet = start_server(first_ms=5)  # no such counter: nothing said
    code, doc, _ = replay(quiet.url, "--traces", str(folder), "--conc", "1", "--duration", "1")
    assert code == 0 and doc["levels"][0]["counts"]["server_kernel_compiles"] is None
    assert "compiled" not in format_level(doc["levels"][0])


def test_recycled_sessions_get_a_new_salt(start_server, sessions, replay):
    server = start_server(keep_prompts=True)
    folder = sessions({"n_requests": 3, "think": 0.0, "n_out": 2})
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "1", "--duration", "0.6",
                                "--start-offset", "0:0", "--vocab-size", "50000")
    assert code == 0
    prompts = {rec["id"]: rec["prompt"] for rec in server.records()["records"]}
    plays = _by_play(records)
    assert len(plays) >= 3
    first_blocks = set()
    for recs in plays.values():
        block = tuple(prompts[recs[0]["id"]][:64])
        first_blocks.add(block)
        # inside one play the conversation prefix is shared (prefix cache can hit)
        for rec in recs[1:]:
            assert tuple(prompts[rec["id"]][:64]) == block
    assert len(first_blocks) == len(plays)  # ... and never across plays


def test_warmup_requests_never_count(start_server, sessions, replay):
    server = start_server(first_ms=2)
    folder = sessions(*({"n_requests": 8, "think": 0.01, "n_out": 3} for _ in range(3)))
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "2", "--duration", "0.8",
                                "--warmup", "3req")
    assert code == 0
    level = doc["levels"][0]
    warm = [r for r in records if not r["counted"]]
    counted = [r for r in records if r["counted"]]
    assert len(warm) == level["counts"]["warmup_requests_ok"] >= 6  # 3 per lane, at least
    assert len(counted) == level["counts"]["requests_ok"] == level["metrics"]["ttft"]["stats"]["count"]
    assert max(r["start_ns"] for r in warm) <= min(r["start_ns"] for r in counted)
    assert len(server.records()["records"]) == len(records)
    # each lane's first request re-sends the context at its start offset: never counted
    first_of_play = [recs[0] for recs in _by_play(records).values()][:2]
    assert all(not r["counted"] for r in first_of_play)


def test_start_offset_places_the_first_session_inside_it(start_server, sessions, replay):
    server = start_server()
    folder = sessions({"n_requests": 20, "think": 0.0, "n_out": 2})
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "1", "--duration", "0.3",
                                "--start-offset", "0.5:0.5")
    assert code == 0
    first = min(records, key=lambda r: r["start_ns"])
    assert first["turn"] == 10 and not first["counted"]


def test_same_seed_same_plan(start_server, sessions, replay):
    server = start_server()
    folder = sessions(*({"n_requests": 10, "think": 0.0, "n_out": 2} for _ in range(5)))
    runs = []
    for _ in range(2):
        _, _, records = replay(server.url, "--traces", str(folder), "--conc", "2", "--duration", "0.3", "--seed", "7")
        runs.append(sorted((r["session"], r["turn"]) for r in records if r["play"] < 2)[:6])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("policy", ["drop", "trim"])
def test_over_context_drops_or_trims(start_server, sessions, replay, policy):
    """--max-context 300: requests of input 200 + 70 i and output 8 fit only for i < 2; trimmed
    ones are sent with exactly 300 - 8 input tokens, dropped ones never."""
    server = start_server()
    folder = sessions({"n_requests": 5, "think": 0.0, "n_out": 8})
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "1", "--duration", "0.5",
                                "--max-context", "300", "--over-context", policy, "--start-offset", "0:0")
    assert code == 0
    sizes = {r["isl"] for r in records}
    assert max(sizes) <= 292
    assert (292 in sizes) == (policy == "trim")
    seen = {r["id"]: r for r in server.records()["records"]}
    assert all(seen[r["id"]]["n_prompt"] == r["isl"] for r in records)


def test_repeats_replay_the_same_requests_with_fresh_prompts(start_server, sessions, replay):
    """`--repeat`: every repeat measures the same (play, turn) requests (so repeats compare request
    by request), with new prompt salts (so a later repeat does not hit the earlier one's cache)."""
    server = start_server(keep_prompts=True)
    folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 2} for _ in range(4)))
    code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "2", "--duration", "0.6", "--repeat", "2",
                          "--vocab-size", "50000")
    assert code == 0
    first, second = ({(str(p), a or "main", str(t)) for p, a, t in
                      zip(level["requests"]["play"], level["requests"]["agent"], level["requests"]["turn"])}
                     for level in doc["levels"])
    shared = first & second
    assert len(shared) >= 0.8 * min(len(first), len(second))
    prompts: dict[tuple[str, ...], set[tuple[int, ...]]] = {}
    for rec in server.records()["records"]:
        prompts.setdefault(tuple(rec["id"].split("-")[:3]), set()).add(tuple(rec["prompt"]))
    assert all(len(prompts[key]) >= 2 for key in shared)


@pytest.mark.parametrize("warmup", ["1req", "0s"])
def test_a_later_level_finds_its_lanes_primed_history_and_nothing_after(start_server, sessions, replay, warmup):
    """Levels of 2 then 3 lanes: lanes 0 and 1 play the same sessions from the same offsets at both
    (turn 10 of 20: a history of 14 blocks of 64 tokens); with a warm-up, the level-2 prompts repeat
    level 1's history blocks exactly (the server's cache finds them primed), while the blocks after
    it (turn 11's 15th) are the level's own. Without a warm-up nothing is primed, nothing shared."""
    server = start_server(keep_prompts=True)
    folder = sessions(*({"n_requests": 20, "think": 0.0, "n_out": 2} for _ in range(4)))
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "2,3", "--duration", "0.4",
                                "--warmup", warmup, "--start-offset", "0.5:0.5", "--vocab-size", "50000")
    assert code == 0
    prompts = {rec["id"]: rec["prompt"] for rec in server.records()["records"]}
    first_plays: dict[tuple[int, int], dict[int, dict]] = defaultdict(dict)  # (level, lane) -> turn -> record
    for rec in records:
        level, number = divmod(rec["play"], 1 << 32)
        if number < (2, 3)[level] and rec["agent"] == "":
            first_plays[level, number][rec["turn"]] = rec
    for lane in (0, 1):
        before, after = first_plays[0, lane], first_plays[1, lane]
        assert before[10]["session"] == after[10]["session"]
        start = [prompts[before[10]["id"]], prompts[after[10]["id"]]]
        next_ = [prompts[before[11]["id"]], prompts[after[11]["id"]]]
        assert (start[0][:896] == start[1][:896]) == (warmup == "1req") == (next_[0][:896] == next_[1][:896])
        assert next_[0][896:960] != next_[1][896:960]
    assert first_plays[1, 2][10]["session"] not in {first_plays[1, lane][10]["session"] for lane in (0, 1)}
