"""Statistics on a hand-made trace with known answers, and on the bundled set."""

from __future__ import annotations

import pytest

from traces import load_traces
from traces.scale import ScaleConfig, scale_traces
from traces.stats import theoretical_hit_rate, trace_stats


@pytest.fixture
def two_sessions(files):
    lone = {"id": "lone", "block_size": 4, "requests": [{"t": 0, "in": 8, "out": 1, "hash_ids": [1, 2]}]}
    return load_traces(files.jsonl("two.jsonl", [files.session("tiny"), lone]))


def test_hit_rate_follows_start_order_across_parent_and_subagent(two_sessions) -> None:
    tiny, lone = two_sessions.sessions
    # Start order: r0 (t 0) misses; subagent s0 (t 3) hits [1,2]; s1 (t 5) hits [1,2], misses 7;
    # r1 (t 5, after s1 in file order) hits [1,2], misses 3; r2 hits [1]. 7 blocks of 4 tokens.
    assert theoretical_hit_rate(tiny) == pytest.approx(28 / 58)
    assert theoretical_hit_rate(lone) == 0.0  # ids are local: another session's blocks never count


def test_stats_known_answers(two_sessions) -> None:
    st = trace_stats(two_sessions)
    assert (st.name, st.format, st.block_size) == ("two", "sessions", 4)
    assert (st.sessions, st.sessions_with_subagents, st.subagents, st.requests, st.subagent_requests) == (2, 1, 1, 6, 2)
    assert (st.input_tokens_total, st.output_tokens_total) == (66, 16)
    # Inputs 10, 9, 13, 14, 12, 8 -> sorted 8 9 10 12 13 14.
    assert (st.input_tokens.p50, st.input_tokens.max, st.input_tokens.count) == (11.0, 14.0, 6)
    assert st.input_tokens.p90 == pytest.approx(13.5)
    assert st.input_tokens.mean == pytest.approx(11.0)
    assert (st.output_tokens.p50, st.output_tokens.max) == (2.5, 5.0)
    assert (st.think_time.p50, st.think_time.max) == (0.5, 3.5)
    # tiny ends with r2 at 10 + 0.5 s; lone has no api_time, so it ends where it starts.
    assert (st.session_duration.max, st.session_duration.p50, st.session_duration_total) == (10.5, 5.25, 10.5)
    assert st.hit_rate == pytest.approx(28 / 66)
    assert st.scale is None


def test_stats_carry_the_scale_report(two_sessions) -> None:
    scaled, report = scale_traces(two_sessions, ScaleConfig(max_context=14))
    st = trace_stats(scaled, report)
    assert st.requests == 3 and st.to_dict()["scale"]["dropped"] == 3
    assert "3 of 6 requests dropped" in st.format_table()


def test_bundled_set_stats_are_plausible() -> None:
    st = trace_stats(load_traces("agentic-coding"))
    assert st.sessions >= 20 and st.subagents == 18
    assert 0.8 < st.hit_rate < 1.0
    assert st.input_tokens.p50 > 50_000 and st.output_tokens.p50 < 1_000
    table = st.format_table()
    assert "agentic-coding" in table and "hit rate" in table and "input tokens" in table
