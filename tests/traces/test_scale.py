"""Scaling: token scale, context cap (drop and trim), think-time scale and cap, and the report."""

from __future__ import annotations

import pytest

from traces import TraceError, load_traces
from traces.scale import ScaleConfig, scale_traces


def _tiny(session_file):
    return load_traces(session_file)


def test_identity_changes_nothing(session_file) -> None:
    ts = _tiny(session_file)
    scaled, report = scale_traces(ts, ScaleConfig())
    assert scaled == ts
    assert (report.requests, report.dropped, report.trimmed, report.think_times_capped) == (5, 0, 0, 0)


def test_token_scale_rounds_keeps_out_positive_and_truncates_hash_ids(session_file) -> None:
    scaled, _ = scale_traces(_tiny(session_file), ScaleConfig(token_scale=0.5))
    (s,) = scaled.sessions
    got = [(r.input_tokens, r.output_tokens, r.hash_ids) for r in s.all_requests()]
    assert got == [(5, 3, (1,)), (5, 2, (1,)), (7, 1, (1,)), (7, 2, (1,)), (6, 1, (1,))]
    bigger, _ = scale_traces(_tiny(session_file), ScaleConfig(token_scale=3.0))
    assert [(r.input_tokens, r.hash_ids) for r in bigger.sessions[0].requests] == [
        (30, (1, 2)), (42, (1, 2, 3)), (36, (1, 5, 6))]


def test_max_context_drop_reanchors_subagents(session_file) -> None:
    scaled, report = scale_traces(_tiny(session_file), ScaleConfig(max_context=14))
    (s,) = scaled.sessions
    assert [r.index for r in s.requests] == [4]
    (sub,) = s.subagents
    assert [r.index for r in sub.requests] == [1] and sub.after_request == 0
    assert (report.dropped, report.trimmed, report.subagents_dropped, report.sessions_dropped) == (3, 0, 0, 0)


def test_max_context_trim_keeps_the_leading_tokens(session_file) -> None:
    scaled, report = scale_traces(_tiny(session_file), ScaleConfig(max_context=14, over_context="trim"))
    got = [(r.index, r.input_tokens, r.output_tokens, r.hash_ids) for r in scaled.sessions[0].all_requests()]
    assert got == [(0, 9, 5, (1, 2)), (1, 9, 3, (1, 2)), (2, 12, 2, (1, 2, 7)), (3, 10, 4, (1, 2)),
                   (4, 12, 1, (1, 5, 6))]
    assert (report.dropped, report.trimmed) == (0, 3)
    # An output that alone fills the context cannot be trimmed into it.
    _, report = scale_traces(_tiny(session_file), ScaleConfig(max_context=5, over_context="trim"))
    assert (report.dropped, report.trimmed) == (1, 4)


def test_think_time_scale_and_cap_keep_recorded_start_times(session_file) -> None:
    scaled, report = scale_traces(_tiny(session_file), ScaleConfig(think_time_scale=0.5, think_time_cap=1.0))
    (s,) = scaled.sessions
    assert [(r.t, r.think_time) for r in s.requests] == [(0.0, 0.0), (5.0, 1.0), (10.0, 1.0)]
    (sub,) = s.subagents
    assert sub.t == 3.0 and [(r.t, r.think_time) for r in sub.requests] == [(0.0, 0.0), (2.0, 0.5)]
    assert report.think_times_capped == 2


def test_whole_subagents_and_sessions_dropped(files) -> None:
    doc = files.session("a")
    doc["requests"][1]["requests"] = [{"in": 100, "out": 1}]
    big = {"id": "big", "block_size": 4, "requests": [{"in": 500, "out": 1}]}
    ts = load_traces(files.jsonl("two.jsonl", [doc, big]))
    scaled, report = scale_traces(ts, ScaleConfig(max_context=50))
    assert [s.id for s in scaled.sessions] == ["a"] and scaled.sessions[0].subagents == ()
    assert (report.dropped, report.subagents_dropped, report.sessions_dropped) == (2, 1, 1)


def test_dropping_everything_and_bad_knobs_raise(session_file) -> None:
    with pytest.raises(TraceError, match="max_context=3 drops every request"):
        scale_traces(_tiny(session_file), ScaleConfig(max_context=3))
    for kwargs, field in (({"max_context": 1}, "max_context"), ({"over_context": "keep"}, "over_context"),
                          ({"token_scale": 0}, "token_scale"), ({"think_time_scale": -1}, "think_time_scale"),
                          ({"think_time_cap": -2.0}, "think_time_cap")):
        with pytest.raises(TraceError, match=field):
            ScaleConfig(**kwargs)
