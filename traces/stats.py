"""Statistics of a trace set: sizes, token and think-time distributions, recorded durations, theoretical cache hits.

Definitions (all over parent and subagent requests together):

- percentiles: numpy's linear interpolation between closest ranks.
- session duration, as recorded (scaling think times leaves `t` as it was): the latest end of
  any of its requests, where a request ends at its start `t` (subagent requests: subagent start
  + `t`) plus its recorded `api_time` (0 when absent).
- theoretical prefix-cache hit rate (infinite cache): a request's input token counts as a hit
  when the full block holding it, and every block before it, appeared as the same leading run of
  hash ids in an earlier request of the same session (parent or subagent, ordered by absolute
  start time). Tokens of the trailing partial block never hit. The set's rate is
  hit tokens / input tokens summed over all sessions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from traces.scale import ScaleReport
from traces.schema import Request, Session, TraceSet


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        data = np.fromiter(values, dtype=np.float64)
        if data.size == 0:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return cls(int(data.size), float(data.mean()), float(p50), float(p90), float(p99), float(data.max()))


@dataclass(frozen=True, slots=True)
class TraceStats:
    name: str
    format: str
    block_size: int
    sessions: int
    sessions_with_subagents: int
    subagents: int
    requests: int  # parent and subagent requests
    subagent_requests: int
    input_tokens_total: int
    output_tokens_total: int
    input_tokens: Distribution  # per request
    output_tokens: Distribution
    think_time: Distribution  # seconds
    session_duration: Distribution  # seconds
    session_duration_total: float
    hit_rate: float  # theoretical, infinite cache, weighted by input tokens
    scale: ScaleReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format_table(self) -> str:
        lines = [
            f"trace set   {self.name} ({self.format}, {self.block_size}-token blocks)",
            f"sessions    {self.sessions:,} ({self.sessions_with_subagents:,} with subagents, "
            f"{self.subagents:,} subagents)",
            f"requests    {self.requests:,} ({self.subagent_requests:,} by subagents)",
            f"tokens      {self.input_tokens_total:,} input, {self.output_tokens_total:,} output",
            f"duration    recorded: median {_clock(self.session_duration.p50)} per session, "
            f"max {_clock(self.session_duration.max)}, total {_clock(self.session_duration_total)}",
            f"prefix-cache hit rate (theoretical, infinite cache): {self.hit_rate:.1%}",
            "",
            f"{'per request':<16}{'mean':>11}{'p50':>11}{'p90':>11}{'p99':>11}{'max':>11}",
        ]
        for label, dist, fmt in (
            ("input tokens", self.input_tokens, "{:,.0f}"),
            ("output tokens", self.output_tokens, "{:,.0f}"),
            ("think time (s)", self.think_time, "{:,.1f}"),
        ):
            cells = "".join(f"{fmt.format(v):>11}" for v in (dist.mean, dist.p50, dist.p90, dist.p99, dist.max))
            lines.append(f"{label:<16}{cells}")
        if self.scale is not None:
            lines += ["", _scale_line(self.scale)]
        return "\n".join(lines)


def trace_stats(ts: TraceSet, report: ScaleReport | None = None) -> TraceStats:
    requests = [r for s in ts.sessions for r in s.all_requests()]
    hits = sum(_hit_tokens(s) for s in ts.sessions)
    inputs = sum(r.input_tokens for r in requests)
    durations = [_duration(s) for s in ts.sessions]
    return TraceStats(
        name=ts.name,
        format=ts.format,
        block_size=ts.block_size,
        sessions=len(ts.sessions),
        sessions_with_subagents=sum(1 for s in ts.sessions if s.subagents),
        subagents=sum(len(s.subagents) for s in ts.sessions),
        requests=len(requests),
        subagent_requests=sum(len(sub.requests) for s in ts.sessions for sub in s.subagents),
        input_tokens_total=inputs,
        output_tokens_total=sum(r.output_tokens for r in requests),
        input_tokens=Distribution.of(r.input_tokens for r in requests),
        output_tokens=Distribution.of(r.output_tokens for r in requests),
        think_time=Distribution.of(r.think_time for r in requests),
        session_duration=Distribution.of(durations),
        session_duration_total=float(sum(durations)),
        hit_rate=hits / inputs if inputs else 0.0,
        scale=report,
    )


def theoretical_hit_rate(session: Session) -> float:
    """Share of the session's input tokens an infinite prefix cache would serve (see module docstring)."""
    inputs = sum(r.input_tokens for r in session.all_requests())
    return _hit_tokens(session) / inputs if inputs else 0.0


def _timed(session: Session) -> Iterator[tuple[float, Request]]:
    """Every request with its absolute start on the session's timeline."""
    for request in session.requests:
        yield request.t, request
    for sub in session.subagents:
        for request in sub.requests:
            yield sub.t + request.t, request


def _hit_tokens(session: Session) -> int:
    # A trie of hash-id runs: (node, hash id) -> child node; node 0 is the empty prefix. A block
    # hits when its whole leading run is already in the trie; after the first miss the walk is
    # in fresh nodes, so every later block of the request misses too.
    children: dict[tuple[int, int], int] = {}
    hit_blocks = 0
    for _, request in sorted(_timed(session), key=lambda pair: (pair[0], pair[1].index)):
        node = 0
        for hash_id in request.hash_ids:
            key = (node, hash_id)
            child = children.get(key)
            if child is None:
                child = children[key] = len(children) + 1
            else:
                hit_blocks += 1
            node = child
    return hit_blocks * session.block_size


def _duration(session: Session) -> float:
    return max((start + (r.api_time or 0.0) for start, r in _timed(session)), default=0.0)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _scale_line(report: ScaleReport) -> str:
    cfg = report.config
    knobs = ", ".join(f"{k}={v}" for k, v in asdict(cfg).items() if v != getattr(type(cfg)(), k))
    return (
        f"scaling     {knobs or 'none'}\n"
        f"            {report.dropped:,} of {report.requests:,} requests dropped, {report.trimmed:,} trimmed, "
        f"{report.think_times_capped:,} think times capped\n"
        f"            {report.subagents_dropped:,} subagents and {report.sessions_dropped:,} sessions left empty"
    )
