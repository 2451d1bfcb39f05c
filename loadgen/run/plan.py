"""The workload plan: which session each lane plays next, where it starts, with which salt, and
when open-loop requests are due. Everything here is seeded, so one seed gives one plan.

Closed loop: `LanePlays` gives lane l its r-th play (a session with a fresh salt, so a recycled
session never hits the prefix cache of its earlier play) by seed, lane and round alone, the same at
every level: levels differ in their number of lanes only. A lane's first play starts at a seeded
offset inside the session (uniform in `start_offset`, default 25-75 % of its parent requests);
the request at that offset is re-sent first as warm-up so its prefix is cached. Open loop: a
shared, seeded `PlaySource` hands out plays in shuffled passes.

Timing of a play (`subagent_delay`, `joins_before`): a parent request waits its recorded think
time after the previous parent request ends (traces.scale_traces has already scaled and capped
think times; `TimingConfig` applies the same scale and cap to the gaps below, read from `t`). A subagent starts
after the parent request before it ends, plus the recorded gap between that request's end
(t + api_time) and the subagent's start. A parent request whose recorded start lies after a
subagent's recorded end waits for that subagent (the tool result it needs), then the recorded
gap since that end. Subagents run their own request chain with their own think times.

Open loop: `poisson_arrivals` spreads a trace's requests over exponential gaps at a rate;
`timestamp_arrivals` keeps a Mooncake trace's recorded times (scaled by `time_scale`).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from traces import Request, Session, Subagent

SALT_BITS = 62  # a play's prompt salt; a repeat shifts it within these bits (runner.py)


@dataclass(frozen=True, slots=True)
class TimingConfig:
    think_time_scale: float = 1.0
    think_time_cap: float | None = None

    def scaled(self, seconds: float) -> float:
        value = max(0.0, seconds) * self.think_time_scale
        return value if self.think_time_cap is None else min(value, self.think_time_cap)


@dataclass(frozen=True, slots=True)
class History:
    """The context a lane's first play starts from, primed by the warm-up: its blocks (`hash_ids`,
    the start request's) are drawn with `salt`, the lane's own at every level (LanePlays)."""

    salt: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Play:
    """One replay of a session: `play_id` is unique in the run; `salt` draws its prompts' blocks
    (but those of `history`, when it has one)."""

    play_id: int
    session: Session
    start_index: int  # first parent request to send; > 0 only for a lane's first play
    salt: int
    history: History | None = None


class PlaySource:
    """Seeded endless stream of plays: sessions in shuffled order, reshuffled on each pass."""

    def __init__(self, sessions: tuple[Session, ...], seed: int, start_offset: tuple[float, float],
                 first_id: int = 0) -> None:
        if not sessions:
            raise ValueError("the trace set has no sessions to replay")
        self._sessions = sessions
        self._rng = random.Random(seed)
        self._salt_rng = random.Random(seed ^ 0x5A17)
        self._start_offset = start_offset
        self._order: list[int] = []
        self._next_id = first_id

    def next_play(self, first_of_lane: bool) -> Play:
        if not self._order:
            self._order = list(range(len(self._sessions)))
            self._rng.shuffle(self._order)
        session = self._sessions[self._order.pop()]
        start = 0
        if first_of_lane and len(session.requests) > 1:
            low, high = self._start_offset
            start = min(int(self._rng.uniform(low, high) * len(session.requests)), len(session.requests) - 1)
        play = Play(self._next_id, session, start, self._salt_rng.getrandbits(SALT_BITS))
        self._next_id += 1
        return play


def subagent_delay(session: Session, sub: Subagent, timing: TimingConfig) -> float:
    """Seconds from the end of the parent request before `sub` (or the play's start) to its start."""
    if sub.after_request == 0:
        return timing.scaled(sub.t)
    before = session.requests[sub.after_request - 1]
    return timing.scaled(sub.t - (before.t + (before.api_time or 0.0)))


def subagent_end(sub: Subagent) -> float | None:
    """Recorded end of a subagent on the parent's timeline, when its duration is known."""
    return None if sub.duration_ms is None else sub.t + sub.duration_ms / 1000.0


def joins_before(session: Session, position: int) -> list[tuple[int, float]]:
    """Subagents the parent request at `position` waits for: (subagent number, recorded gap)."""
    request = session.requests[position]
    out = []
    for number, sub in enumerate(session.subagents):
        end = subagent_end(sub)
        if sub.after_request <= position and end is not None and end <= request.t:
            out.append((number, request.t - end))
    return out


def subagents_after(session: Session, position: int) -> list[int]:
    """Numbers of the subagents launched right after parent request `position` - 1 ends."""
    return [n for n, sub in enumerate(session.subagents) if sub.after_request == position]


def poisson_arrivals(source: PlaySource, rate: float, seed: int) -> Iterator[tuple[float, Play, Request]]:
    """Endless (offset_s, play, request): the requests of the source's next plays (parents and
    subagents in file order, each play with its own salt) spaced by exponential gaps of mean 1/rate."""
    if rate <= 0:
        raise ValueError(f"--rate must be > 0, got {rate:g}")
    gaps = random.Random(seed ^ 0xA7713)
    now = 0.0
    while True:
        play = source.next_play(first_of_lane=False)
        for request in play.session.all_requests():
            yield now, play, request
            now += gaps.expovariate(rate)


def timestamp_arrivals(play: Play, time_scale: float) -> Iterator[tuple[float, Play, Request]]:
    """(offset_s, play, request) at the recorded times (Mooncake), multiplied by time_scale."""
    if time_scale <= 0:
        raise ValueError(f"--time-scale must be > 0, got {time_scale:g}")
    requests = play.session.requests
    start = min((r.t for r in requests), default=0.0)
    for request in sorted(requests, key=lambda r: r.t):
        yield (request.t - start) * time_scale, play, request


def max_subagents(sessions: tuple[Session, ...]) -> int:
    return max((len(s.subagents) for s in sessions), default=0)


class LanePlays:
    """The closed loop's plays, fixed by (seed, lane, round) alone: lane `l`'s `r`-th play is the
    same session from the same start offset at every level, whatever its number of lanes, and
    however the lanes are spread over worker processes. A level of N + 1 lanes plays a level of
    N's plays and one lane's more (common random numbers), so a sweep's levels and a capacity
    search's probes differ in their load, not in which sessions and offsets they drew.

    Each round deals lanes 0..S-1 (S sessions) a seeded permutation of the sessions, lanes
    S..2S-1 another, and so on: lanes play different sessions while there are enough. A lane's
    first play starts at a seeded offset in `start_offset`. Salts are the level's own (`level`
    keys them), so no level's requests hit another's prefix cache - but for a primed history:
    with `shared_history`, the context a lane's first play starts from (its start request's
    blocks, which the warm-up re-sends) is drawn with a salt of the lane's own, the same at every
    level and repeat, so a later level's warm-up finds it cached and only the lanes new to the
    run are primed at full cost. The requests after it draw their new blocks with the level's
    salt, as every request of a fresh level would.
    """

    def __init__(self, sessions: tuple[Session, ...], seed: int, level: int, lanes: int,
                 start_offset: tuple[float, float], shared_history: bool = False) -> None:
        if not sessions:
            raise ValueError("the trace set has no sessions to replay")
        self._sessions = sessions
        self._seed = seed
        self._level = level
        self._lanes = lanes
        self._start_offset = start_offset
        self._shared_history = shared_history
        self._id_base = level << 32  # play ids stay unique across the levels of a run
        self._orders: OrderedDict[tuple[int, int], list[int]] = OrderedDict()

    def play(self, lane: int, round_: int) -> Play:
        pass_, slot = divmod(lane, len(self._sessions))
        session = self._sessions[self._order(round_, pass_)[slot]]
        draw = random.Random(f"{self._seed}:lane:{lane}:{round_}")  # the same at every level
        salt = random.Random(f"{self._seed}:{self._level}:salt:{lane}:{round_}").getrandbits(SALT_BITS)
        start, history = 0, None
        if round_ == 0 and len(session.requests) > 1:
            low, high = self._start_offset
            start = min(int(draw.uniform(low, high) * len(session.requests)), len(session.requests) - 1)
            if self._shared_history and start:
                history = History(draw.getrandbits(SALT_BITS), tuple(session.requests[start].hash_ids))
        return Play(self._id_base + round_ * self._lanes + lane, session, start, salt, history)

    def _order(self, round_: int, pass_: int) -> list[int]:
        key = (round_, pass_)
        order = self._orders.get(key)
        if order is None:
            order = list(range(len(self._sessions)))
            random.Random(f"{self._seed}:deal:{round_}:{pass_}").shuffle(order)
            if len(self._orders) >= 256:  # lanes move through the rounds about together
                self._orders.popitem(last=False)
            self._orders[key] = order
        return order
