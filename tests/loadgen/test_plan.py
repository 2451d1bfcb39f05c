"""The seeded plan: play order and salts, start offsets, subagent timing, open-loop arrivals."""

from __future__ import annotations

import pytest

from loadgen.run.level import Warmup
from loadgen.run.plan import (
    LanePlays,
    PlaySource,
    TimingConfig,
    joins_before,
    poisson_arrivals,
    subagent_delay,
    subagents_after,
    timestamp_arrivals,
)
from traces import Request, Session, Subagent


def _request(index: int, t: float, api_time: float = 1.0) -> Request:
    return Request(index=index, t=t, input_tokens=100, output_tokens=5, hash_ids=(1,), think_time=0.0,
                   api_time=api_time)


def _session(sid: str, n: int = 8, subagents: tuple[Subagent, ...] = ()) -> Session:
    return Session(id=sid, block_size=64, models=(), requests=tuple(_request(i, 10.0 * i) for i in range(n)),
                   subagents=subagents, source="memory")


def _subagent(t: float, after: int, duration_s: float) -> Subagent:
    return Subagent(agent_id="a", subagent_type=None, t=t, after_request=after, duration_ms=duration_s * 1000,
                    total_tokens=None, tool_use_count=None, status=None, requests=(_request(99, 0.0),))


def test_plays_cycle_through_every_session_with_fresh_salts():
    sessions = tuple(_session(f"s{i}") for i in range(4))
    source = PlaySource(sessions, seed=1, start_offset=(0.25, 0.75))
    plays = [source.next_play(first_of_lane=False) for _ in range(8)]
    assert sorted(p.session.id for p in plays[:4]) == ["s0", "s1", "s2", "s3"]
    assert len({p.salt for p in plays}) == 8 and [p.play_id for p in plays] == list(range(8))
    again = PlaySource(sessions, seed=1, start_offset=(0.25, 0.75))
    assert [again.next_play(False).salt for _ in range(8)] == [p.salt for p in plays]


def test_first_plays_start_inside_the_offset_range():
    source = PlaySource((_session("s", n=100),), seed=3, start_offset=(0.25, 0.75))
    starts = [source.next_play(first_of_lane=True).start_index for _ in range(50)]
    assert all(25 <= s < 75 for s in starts) and len(set(starts)) > 10
    assert source.next_play(first_of_lane=False).start_index == 0


def test_subagent_timing_follows_the_parent_timeline():
    early = _subagent(t=25.0, after=2, duration_s=5.0)  # parent request 1 ends at 10 + 1 = 11
    late = _subagent(t=3.0, after=0, duration_s=100.0)
    session = _session("s", subagents=(early, late))
    timing = TimingConfig(think_time_scale=0.5, think_time_cap=5.0)
    assert subagent_delay(session, early, timing) == 5.0  # (25 - 11) * 0.5 = 7, capped at 5
    assert subagent_delay(session, late, TimingConfig()) == 3.0
    assert subagents_after(session, 2) == [0] and subagents_after(session, 0) == [1]
    # parent request 4 (t=40) starts after `early` ended (t=30): it waits for it; `late` ends at 103
    assert joins_before(session, 4) == [(0, 10.0)]
    assert joins_before(session, 2) == []


def test_open_loop_arrivals():
    sessions = (_session("a", n=3), _session("b", n=3))
    arrivals = poisson_arrivals(PlaySource(sessions, 0, (0, 0)), rate=10.0, seed=0)
    first = [next(arrivals) for _ in range(6)]
    assert [offset for offset, _, _ in first] == sorted(offset for offset, _, _ in first)
    assert {play.play_id for _, play, _ in first} == {0, 1}
    play = PlaySource(sessions, 0, (0, 0)).next_play(False)
    assert [offset for offset, _, _ in timestamp_arrivals(play, 0.5)] == [0.0, 5.0, 10.0]
    with pytest.raises(ValueError, match="--rate"):
        next(poisson_arrivals(PlaySource(sessions, 0, (0, 0)), rate=0, seed=0))


@pytest.mark.parametrize("text, seconds, requests", [("30s", 30.0, None), ("2.5", 2.5, None), ("3req", 0.0, 3)])
def test_warmup_syntax(text, seconds, requests):
    assert Warmup.parse(text) == Warmup(seconds, requests)


@pytest.mark.parametrize("text", ["-1s", "xreq", "soon", "-2req"])
def test_bad_warmup_is_named(text):
    with pytest.raises(ValueError, match="--warmup"):
        Warmup.parse(text)


def test_a_lanes_plays_are_the_same_at_every_level_with_the_levels_own_salts():
    """LanePlays: lane l's sessions and start offset depend on (seed, lane, round) only, so a level
    of more lanes plays a smaller one's plays and more; each round deals lanes distinct sessions;
    salts are the level's; a primed history's salt is the lane's, shared by every level."""
    sessions = tuple(_session(f"s{i}", n=40) for i in range(5))
    small = LanePlays(sessions, seed=3, level=0, lanes=3, start_offset=(0.25, 0.75), shared_history=True)
    large = LanePlays(sessions, seed=3, level=4, lanes=7, start_offset=(0.25, 0.75), shared_history=True)
    for lane in range(3):
        for round_ in range(3):
            a, b = small.play(lane, round_), large.play(lane, round_)
            assert (a.session.id, a.start_index, a.history) == (b.session.id, b.start_index, b.history)
            assert a.salt != b.salt and a.play_id != b.play_id
    first = [large.play(lane, 0) for lane in range(7)]
    assert len({p.session.id for p in first[:5]}) == 5  # a whole deal of the five sessions
    assert all(p.history is not None and p.history.hash_ids == tuple(p.session.requests[p.start_index].hash_ids)
               for p in first)
    assert all(large.play(lane, 1).start_index == 0 and large.play(lane, 1).history is None for lane in range(7))
    other_seed = LanePlays(sessions, seed=4, level=0, lanes=3, start_offset=(0.25, 0.75))
    assert [other_seed.play(lane, 0).history for lane in range(3)] == [None] * 3  # nothing primed: no history
    assert [p.start_index for p in (other_seed.play(lane, 0) for lane in range(3))] != \
        [small.play(lane, 0).start_index for lane in range(3)]
