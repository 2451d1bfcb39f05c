"""Typed records for agentic session traces: requests, subagents, sessions and trace sets.

Every reader produces these frozen records, and everything downstream (synthesis, scaling,
statistics, the load generator) reads only these, never raw JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

SESSIONS = "sessions"
MOONCAKE = "mooncake"
FORMATS = (SESSIONS, MOONCAKE)


class TraceError(ValueError):
    """A trace that cannot be read. The message names the file, the request path and the field."""


@dataclass(frozen=True, slots=True)
class Request:
    """One model call of a session (or of one of its subagents)."""

    index: int  # unique within its Session: position in file order over parent and subagents
    t: float  # start, seconds from its timeline start (the parent's or the subagent's)
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]  # one id per full block of the input, in prompt order
    think_time: float  # seconds between the previous call's end and this one
    api_time: float | None = None
    ttft: float | None = None
    model: str | None = None
    kind: str = "n"  # "n" non-streaming or "s" streaming, as recorded
    input_types: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ()
    stop: str | None = None

    @property
    def thinking(self) -> bool:
        return "thinking" in self.output_types


@dataclass(frozen=True, slots=True)
class Subagent:
    """A child agent that runs in parallel with its parent session from `t` on."""

    agent_id: str
    subagent_type: str | None
    t: float  # start on the parent's timeline, seconds (recorded end t minus duration_ms)
    after_request: int  # number of parent requests before it in file order
    duration_ms: float | None
    total_tokens: int | None
    tool_use_count: int | None
    status: str | None
    requests: tuple[Request, ...]
    models: tuple[str, ...] = ()
    tool_tokens: int | None = None
    system_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """One recorded agent session: the parent's requests and its subagents."""

    id: str
    block_size: int
    models: tuple[str, ...]
    requests: tuple[Request, ...]
    subagents: tuple[Subagent, ...]
    source: str  # file it came from (with ":line N" for a JSONL line)
    tool_tokens: int | None = None
    system_tokens: int | None = None
    hash_id_scope: str | None = None

    def all_requests(self) -> Iterator[Request]:
        """Parent and subagent requests in file order (ascending `index`)."""
        subagents = iter(self.subagents)
        pending = next(subagents, None)
        for position, request in enumerate(self.requests):
            while pending is not None and pending.after_request <= position:
                yield from pending.requests
                pending = next(subagents, None)
            yield request
        while pending is not None:
            yield from pending.requests
            pending = next(subagents, None)


@dataclass(frozen=True, slots=True)
class TraceSet:
    """Sessions read from one source, all with the same block size."""

    name: str  # bundled set name or file/directory stem
    format: str  # "sessions" | "mooncake"
    block_size: int
    sessions: tuple[Session, ...]
