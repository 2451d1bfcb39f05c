"""Scaling knobs that fit real traces onto small models and CPU runs: context cap, token scale, think time.

Order of operations for every request (parent and subagent alike):

1. token scale: `in` and `out` are multiplied by `token_scale` and rounded half up (`out` stays >= 1);
   hash ids are never invented, only the leading `in // block_size` ids are kept, so requests
   that shared a prefix still share it (shorter or with a longer unique tail).
2. context cap: a request with `in + out > max_context` is dropped (`over_context="drop"`) or
   trimmed (`"trim"`): its input keeps its first `max_context - out` tokens and the hash ids of the
   full blocks inside them. Keeping the leading part (system prompt, oldest context) keeps the
   prefix-sharing structure of the session, so a capped replay exercises a prefix cache as the
   real session did. A request whose `out` alone reaches `max_context` is dropped even when trimming.
3. think time: multiplied by `think_time_scale`, then capped at `think_time_cap` seconds.
   Recorded start times `t` are left as they were: a replay planner that derives other gaps
   from `t` (subagent starts, joins) applies the same scale and cap to those gaps itself.

Subagents keep their place between the same parent requests (`after_request` counts only the
parent requests kept). Subagents and sessions left without requests are removed; the
ScaleReport counts every change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from traces.schema import Request, Session, TraceError, TraceSet

OVER_CONTEXT_POLICIES = ("drop", "trim")


@dataclass(frozen=True)
class ScaleConfig:
    max_context: int | None = None  # input + output tokens above it -> over_context policy
    over_context: str = "drop"  # "drop" | "trim" (keep the leading tokens, see module docstring)
    token_scale: float = 1.0  # multiply in/out token counts (hash ids truncated to fit)
    think_time_scale: float = 1.0
    think_time_cap: float | None = None  # seconds

    def __post_init__(self) -> None:
        if self.max_context is not None and (
            isinstance(self.max_context, bool) or not isinstance(self.max_context, int) or self.max_context < 2
        ):
            raise TraceError(f"max_context must be an integer >= 2, got {self.max_context!r}")
        if self.over_context not in OVER_CONTEXT_POLICIES:
            choices = ", ".join(OVER_CONTEXT_POLICIES)
            raise TraceError(f"over_context must be one of {choices}, got {self.over_context!r}")
        if not self.token_scale > 0:
            raise TraceError(f"token_scale must be > 0, got {self.token_scale!r}")
        if not self.think_time_scale >= 0:
            raise TraceError(f"think_time_scale must be >= 0, got {self.think_time_scale!r}")
        if self.think_time_cap is not None and not self.think_time_cap >= 0:
            raise TraceError(f"think_time_cap must be >= 0 seconds, got {self.think_time_cap!r}")


@dataclass(frozen=True)
class ScaleReport:
    config: ScaleConfig
    requests: int = 0  # requests before scaling (parent and subagent)
    dropped: int = 0  # over max_context (drop policy, or out alone too long)
    trimmed: int = 0  # input cut to fit max_context
    think_times_capped: int = 0
    subagents_dropped: int = 0  # every request dropped
    sessions_dropped: int = 0  # every request dropped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Tally:
    """Mutable counters while scaling; frozen into a ScaleReport at the end."""

    def __init__(self) -> None:
        self.requests = self.dropped = self.trimmed = self.think_times_capped = 0
        self.subagents_dropped = self.sessions_dropped = 0


def scale_traces(ts: TraceSet, cfg: ScaleConfig) -> tuple[TraceSet, ScaleReport]:
    """Apply `cfg` to every session of `ts`; raises TraceError if nothing is left."""
    tally = _Tally()
    sessions = []
    for session in ts.sessions:
        scaled = _scale_session(session, ts.block_size, cfg, tally)
        if scaled is None:
            tally.sessions_dropped += 1
        else:
            sessions.append(scaled)
    if not sessions:
        raise TraceError(f"{ts.name}: max_context={cfg.max_context} drops every request of every session")
    report = ScaleReport(config=cfg, **vars(tally))
    return replace(ts, sessions=tuple(sessions)), report


def _scale_session(session: Session, block_size: int, cfg: ScaleConfig, tally: _Tally) -> Session | None:
    requests = _scale_timeline(session.requests, block_size, cfg, tally)
    kept = {r.index for r in requests}
    subagents = []
    for sub in session.subagents:
        sub_requests = _scale_timeline(sub.requests, block_size, cfg, tally)
        if sub.requests and not sub_requests:
            tally.subagents_dropped += 1
            continue
        after = sum(1 for r in session.requests[: sub.after_request] if r.index in kept)
        subagents.append(replace(sub, after_request=after, requests=tuple(sub_requests)))
    if not requests and not any(sub.requests for sub in subagents):
        return None
    return replace(session, requests=tuple(requests), subagents=tuple(subagents))


def _scale_timeline(requests: tuple[Request, ...], block_size: int, cfg: ScaleConfig, tally: _Tally) -> list[Request]:
    kept = []
    for request in requests:
        tally.requests += 1
        think = request.think_time * cfg.think_time_scale
        if cfg.think_time_cap is not None and think > cfg.think_time_cap:
            think = cfg.think_time_cap
            tally.think_times_capped += 1
        tokens = _scale_tokens(request, cfg, tally)
        if tokens is None:
            continue
        input_tokens, output_tokens = tokens
        if (input_tokens, output_tokens, think) == (request.input_tokens, request.output_tokens, request.think_time):
            kept.append(request)  # unchanged (a replay at scale 1): no copy; start-up time matters
        else:
            kept.append(replace(request, input_tokens=input_tokens, output_tokens=output_tokens,
                                hash_ids=request.hash_ids[: input_tokens // block_size], think_time=think))
    return kept


def _scale_tokens(request: Request, cfg: ScaleConfig, tally: _Tally) -> tuple[int, int] | None:
    """(input, output) tokens after the token scale and the context cap; None when dropped."""
    input_tokens = int(request.input_tokens * cfg.token_scale + 0.5)
    output_tokens = max(1, int(request.output_tokens * cfg.token_scale + 0.5))
    if cfg.max_context is not None and input_tokens + output_tokens > cfg.max_context:
        if cfg.over_context == "drop" or output_tokens >= cfg.max_context:
            tally.dropped += 1
            return None
        input_tokens = cfg.max_context - output_tokens
        tally.trimmed += 1
    return input_tokens, output_tokens
