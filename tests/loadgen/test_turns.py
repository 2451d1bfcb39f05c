"""Per-turn, per-context and per-session breakdowns of a level's request columns (loadgen/results/turns.py),
against numbers worked out by hand."""

from __future__ import annotations

import pytest

from loadgen.report.table import sessions_text
from loadgen.results.turns import TURN_BUCKETS, turn_summary

NAMES = ("play", "session", "agent", "turn", "isl", "osl", "ttft_us", "e2el_us", "tpot_us", "start_ms")
# play, session, agent, turn, isl, osl, ttft_us, e2el_us, tpot_us, start_ms; and whether it was good
REQUESTS = (
    (7, "s1", "", 0, 500, 10, 100_000, 1_000_000, 100_000, 0.0, True),
    (7, "s1", "", 1, 1500, 10, 200_000, 2_000_000, 200_000, 2000.0, True),
    (7, "s1", "a1", 0, 800, 1, 300_000, 300_000, None, 1000.0, False),
    (7, "s1", "", 2, 3000, 10, 400_000, 1_500_000, None, 5000.0, True),
    (9, "s2", "", 3, 2000, 10, 500_000, 3_000_000, 250_000, 100.0, False),
    (9, "s2", "", 4, 2500, 10, 600_000, 2_000_000, 150_000, 4000.0, True),
    (11, "s3", "", 0, 300, 10, 50_000, 500_000, 50_000, 200.0, True),
    (12, "s1", "a1", 1, 700, 10, 70_000, 800_000, 80_000, 300.0, True),  # a replay of s1 seen in its subagent only
    (13, "s4", "", 130, 300_000, 10, 9_000_000, 20_000_000, 1_100_000, 10_000.0, False),
)
COLUMNS = {name: [r[i] for r in REQUESTS] for i, name in enumerate(NAMES)}
GOOD = [r[-1] for r in REQUESTS]
SESSION_TURNS = {"s1": 3, "s2": 5, "s4": 131}  # s3's length unknown


def _stats(ttft, tpot, e2el):
    return {"ttft_ms": dict(zip(("p50", "p90"), ttft)), "tpot_ms": dict(zip(("p50", "p90"), tpot)),
            "e2el_s": dict(zip(("p50", "p90"), e2el))}


def test_parent_requests_by_turn_bucket():
    rows = turn_summary(COLUMNS, GOOD, SESSION_TURNS)["by_turn"]
    assert rows == [
        # turns 0, 0, 1: TTFT 50, 100, 200 ms -> nearest rank p50 the 2nd of 3, p90 the 3rd
        {"turns": [0, 1], "label": "0-1", "requests": 3, "isl_mean": 766.7,
         **_stats((100.0, 200.0), (100.0, 200.0), (1.0, 2.0)), "good_share": 1.0},
        # turns 2 (no TPOT: TPOT percentiles over the one that has it) and 3
        {"turns": [2, 3], "label": "2-3", "requests": 2, "isl_mean": 2500.0,
         **_stats((400.0, 500.0), (250.0, 250.0), (1.5, 3.0)), "good_share": 0.5},
        {"turns": [4, 7], "label": "4-7", "requests": 1, "isl_mean": 2500.0,
         **_stats((600.0, 600.0), (150.0, 150.0), (2.0, 2.0)), "good_share": 1.0},
        {"turns": [128, None], "label": "128+", "requests": 1, "isl_mean": 300000.0,
         **_stats((9000.0, 9000.0), (1100.0, 1100.0), (20.0, 20.0)), "good_share": 0.0},
    ]  # the subagents' requests (turns 0 and 1 of a1) are in no turn bucket


def test_every_request_by_context_bucket():
    rows = turn_summary(COLUMNS, GOOD, SESSION_TURNS)["by_context"]
    assert rows == [
        # 500, 800 (subagent, no TPOT), 300, 700 tokens: TTFT 100, 300, 50, 70 -> 70 (2nd of 4), 300 (4th)
        {"context": [0, 1024], "label": "<1k", "requests": 4, "isl_mean": 575.0,
         **_stats((70.0, 300.0), (80.0, 100.0), (0.5, 1.0)), "good_share": 0.75},
        {"context": [1024, 2048], "label": "1k-2k", "requests": 2, "isl_mean": 1750.0,
         **_stats((200.0, 500.0), (200.0, 250.0), (2.0, 3.0)), "good_share": 0.5},
        {"context": [2048, 4096], "label": "2k-4k", "requests": 2, "isl_mean": 2750.0,
         **_stats((400.0, 600.0), (150.0, 150.0), (1.5, 2.0)), "good_share": 1.0},
        {"context": [262144, None], "label": ">=256k", "requests": 1, "isl_mean": 300000.0,
         **_stats((9000.0, 9000.0), (1100.0, 1100.0), (20.0, 20.0)), "good_share": 0.0},
    ]


def test_context_bucket_edges_are_powers_of_two_kibitokens():
    columns = {**COLUMNS, "isl": [1023, 1024, 2047, 2048, 131071, 131072, 262143, 262144, 10**6]}
    rows = turn_summary(columns)["by_context"]
    assert [(row["label"], row["requests"]) for row in rows] == [
        ("<1k", 1), ("1k-2k", 2), ("2k-4k", 1), ("64k-128k", 1), ("128k-256k", 2), (">=256k", 2)]


def test_a_200_turn_session_fills_eight_turn_buckets():
    turns = list(range(200))
    columns = {"play": [1] * 200, "session": ["s"] * 200, "agent": [""] * 200, "turn": turns,
               "isl": [1000 + 100 * t for t in turns], "osl": [5] * 200, "ttft_us": [1000] * 200,
               "e2el_us": [2000] * 200, "tpot_us": [250] * 200, "start_ms": [10.0 * t for t in turns]}
    summary = turn_summary(columns, session_turns={"s": 200})
    assert len(TURN_BUCKETS) == 8
    assert [row["requests"] for row in summary["by_turn"]] == [2, 2, 4, 8, 16, 32, 64, 72]
    assert summary["by_turn"][-1]["isl_mean"] == 1000 + 100 * (128 + 199) / 2
    rows = summary["sessions"]["rows"]
    assert rows == [{"play": 1, "session": "s", "requests": 200, "parent_turns": [0, 199], "whole": True,
                     "wall_s": 1.992, "good_share": None}]  # starts 0 .. 1990 ms, the last ends 2 ms later


def test_sessions_rows_whole_flags_wall_times_and_good_shares():
    sessions = turn_summary(COLUMNS, GOOD, SESSION_TURNS)["sessions"]
    assert sessions["rows"] == [
        # first request starts at 0, the last parent one (start 5 s, E2EL 1.5 s) ends at 6.5 s
        {"play": 7, "session": "s1", "requests": 4, "parent_turns": [0, 2], "whole": True, "wall_s": 6.5,
         "good_share": 0.75},
        # began before the window (turn 3 is its first measured)
        {"play": 9, "session": "s2", "requests": 2, "parent_turns": [3, 4], "whole": False, "wall_s": 5.9,
         "good_share": 0.5},
        {"play": 11, "session": "s3", "requests": 1, "parent_turns": [0, 0], "whole": None, "wall_s": 0.5,
         "good_share": 1.0},
        {"play": 12, "session": "s1", "requests": 1, "parent_turns": None, "whole": False, "wall_s": 0.8,
         "good_share": 1.0},
        {"play": 13, "session": "s4", "requests": 1, "parent_turns": [130, 130], "whole": False, "wall_s": 20.0,
         "good_share": 0.0},
    ]
    # wall times 0.5, 0.8, 5.9, 6.5, 20: p50 the 3rd of 5, p90 the 5th
    assert sessions["wall_s"] == {"p50": 5.9, "p90": 20.0, "max": 20.0}
    assert (sessions["count"], sessions["whole_count"], sessions["all_good"]) == (5, 1, 2)
    assert sessions["good_share"] == {"mean": 0.65, "p10": 0.0, "min": 0.0}


def test_the_sessions_line_of_the_table_and_the_html():
    assert sessions_text(turn_summary(COLUMNS, GOOD, SESSION_TURNS)["sessions"]) == (
        "sessions: 5 plays measured, 1 whole; wall time p50 5.9 s, p90 20.0 s; good share mean 65.0 %, p10 0.0 %")
    without = turn_summary(COLUMNS)["sessions"]  # no SLO, no session lengths
    assert sessions_text(without) == "sessions: 5 plays measured; wall time p50 5.9 s, p90 20.0 s"


def test_the_worst_tenth_of_the_plays():
    # 11 plays of 4 requests: play 0 has none good, play 1 one, the others all; p10 is the 2nd of 11
    good = [play >= 2 or (play == 1 and i == 0) for play in range(11) for i in range(4)]
    n = len(good)
    columns = {"play": [p for p in range(11) for _ in range(4)], "session": ["s"] * n, "agent": [""] * n,
               "turn": [i for _ in range(11) for i in range(4)], "isl": [100] * n, "osl": [2] * n,
               "ttft_us": [10] * n, "e2el_us": [20] * n, "tpot_us": [10] * n, "start_ms": [0.0] * n}
    sessions = turn_summary(columns, good, {"s": 4})["sessions"]
    assert sessions["good_share"] == {"mean": round(9.25 / 11, 6), "p10": 0.25, "min": 0.0}
    assert (sessions["all_good"], sessions["whole_count"]) == (9, 11)


def test_without_good_there_are_no_good_shares_and_without_lengths_no_whole_flags():
    summary = turn_summary(COLUMNS)
    assert {row["good_share"] for row in summary["by_turn"] + summary["by_context"]} == {None}
    sessions = summary["sessions"]
    assert (sessions["good_share"], sessions["all_good"], sessions["whole_count"]) == (None, None, None)
    assert {(row["whole"], row["good_share"]) for row in sessions["rows"]} == {(None, None)}
    assert sessions["rows"][0]["parent_turns"] == [0, 2]


def test_older_columns_without_agent_and_start_ms():
    columns = {name: values for name, values in COLUMNS.items() if name not in ("agent", "start_ms")}
    summary = turn_summary(columns, GOOD, SESSION_TURNS)
    assert summary["by_turn"] is None  # parents and subagents cannot be told apart
    assert summary["by_context"] == turn_summary(COLUMNS, GOOD, SESSION_TURNS)["by_context"]
    sessions = summary["sessions"]
    assert (sessions["wall_s"], sessions["whole_count"], sessions["count"]) == (None, None, 5)
    assert sessions["rows"][0] == {"play": 7, "session": "s1", "requests": 4, "parent_turns": None, "whole": None,
                                   "wall_s": None, "good_share": 0.75}


def test_a_level_without_requests():
    summary = turn_summary({name: [] for name in NAMES}, [], SESSION_TURNS)
    assert summary["by_turn"] == [] and summary["by_context"] == []
    assert summary["sessions"] == {"count": 0, "whole_count": 0, "wall_s": {"p50": None, "p90": None, "max": None},
                                   "good_share": {"mean": None, "p10": None, "min": None}, "all_good": 0,
                                   "rows": []}


def test_good_must_match_the_columns():
    with pytest.raises(ValueError, match="good: 2 values for 9 requests"):
        turn_summary(COLUMNS, [True, False])
