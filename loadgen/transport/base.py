"""The transport interface: send one request, get back its timed content chunks.

Kept small on purpose: the HTTP transport implements it over wire.HttpClient, and an in-process
transport can implement it by driving the engine directly. A transport never raises for a
failure of one request; it returns an `Exchange` whose `error` names the kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from loadgen.telemetry.server_counters import ServerCounters


class ErrorKind(str, Enum):
    """Why one request failed. The value is what results files and the per-request file record
    (docs/results_schema.md); a member is a str equal to its value. An HTTP error status is not a
    member: its kind is "http_<status>"."""

    CONNECT = "connect"                # could not open a connection (refused, unreachable)
    RESET = "reset"                    # connection closed or reset after it was opened
    TIMEOUT = "timeout"                # the request took longer than the per-request timeout
    TRUNCATED = "truncated"            # stream ended without [DONE]/usage, or with fewer tokens than asked
    PROTOCOL = "protocol"              # unparseable stream data or an error event inside the stream
    CANCELLED = "cancelled"            # the run ended (or the transport closed) with the request in flight
    ENGINE_REFUSED = "engine_refused"  # in-process: too long for the context or the KV cache
    ENGINE_DEAD = "engine_dead"        # in-process: the engine raised while the request was in flight
    CLIENT = "client"                  # loadgen itself failed while handling the request (a bug, a full disk)

    # Formatted and printed as the bare value, as the strings these replace were.
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # str's, not Enum's


@dataclass(frozen=True, slots=True)
class WireRequest:
    """What goes on the wire: exact prompt token ids and the exact output length."""

    request_id: str
    prompt: np.ndarray  # int32 token ids, len == input tokens
    max_tokens: int
    user: str = ""  # OpenAI's `user` field: names the session play (servers may group by it)
    acceptance_length: float | None = None  # our server's per-request speculative AL (extension field)


@dataclass(slots=True)
class Exchange:
    """One request's outcome. Times are time.perf_counter_ns() values on this host."""

    start_ns: int = 0                                     # when the request was handed to the wire
    end_ns: int = 0                                       # last byte of the response (or the failure)
    chunk_ns: list[int] = field(default_factory=list)     # arrival of each content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each content chunk
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    cached_tokens: int | None = None
    spec_num_drafts: int | None = None           # usage.spec_decode (our server, when it speculates)
    spec_num_accepted_tokens: int | None = None
    error: str | None = None  # an ErrorKind, or "http_<status>"
    error_detail: str | None = None

    @property
    def counted_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def output_tokens(self) -> int:
        """Server-reported completion tokens when given, else counted from the stream."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.counted_tokens


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the server says about itself (/v1/models); `ours` when owned_by == "agentload"."""

    model: str
    ours: bool
    max_model_len: int | None
    num_gpus: int | None
    vocab_size: int | None
    raw: dict[str, Any]


class Transport(ABC):
    """Open once, send many requests concurrently, close once."""

    @abstractmethod
    async def open(self, max_connections: int) -> None: ...

    @abstractmethod
    async def server_info(self) -> ServerInfo:
        """Raise TransportError when the server cannot be reached or answers nonsense."""

    @abstractmethod
    async def send(self, request: WireRequest) -> Exchange: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def server_counters(self) -> ServerCounters | None:
        """Server-wide cumulative counters (loadgen/telemetry/server_counters.py), or None when the server
        has no /metrics; a failure to ask is None too, never an error."""
        return None

    async def metrics_text(self) -> str:
        """The server's /metrics exposition; TransportError when there is none or it cannot be read."""
        raise TransportError("this transport has no /metrics")


class TransportError(Exception):
    """The server as a whole is unusable (unreachable, no models): the run cannot start."""
