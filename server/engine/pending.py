"""A launched step whose sampled tokens are still on their way to the host (overlapped scheduling).

With overlapped scheduling the engine schedules and launches step N+1 before it reads step N's
tokens, so the host's work for N+1 runs while the device computes N. A request that samples in
step N gets a placeholder in its `token_ids` until the token is back: -1 - row, where row is
the token's row in step N's sampled-token tensor (`placeholder` in server/engine/sequence.py).
Step N+1 embeds the real token by gathering it from that tensor on the device
(`fill_placeholders`; a decode graph gathers its ids in one op, server/engine/cuda_graph.py), so
the token never makes a round trip through the host before it is used. Placeholders only ever
refer to the step launched just before: a step's tokens are resolved before the step after next
is scheduled. A speculative step's tokens are its requests' emitted tokens and then their next
drafts (server/engine/spec_decode.py); there placeholders of the step before may still wait in
a request's accepted drafts, so each step numbers its rows in its own bank (`placeholder`).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch

from server.engine.scheduler import ScheduledBatch
from server.engine.sequence import placeholder_row


def to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied from pinned memory so the host does not wait (a copy
    from pageable memory, as torch.tensor(..., device=cuda) makes, waits for the device)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def fill_placeholders(token_ids: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """token_ids (device) with every placeholder replaced by its row of `sampled`; no host sync."""
    is_placeholder = token_ids < 0
    rows = torch.where(is_placeholder, placeholder_row(token_ids), 0)
    return torch.where(is_placeholder, sampled[rows], token_ids)


class TokenCopies:
    """Two pinned host buffers and their events, taken in turn by the launched steps' token copies.
    With overlapped scheduling at most two launched steps are unread at a time (the one in flight
    and the one being launched), so a buffer is read before it is taken again. Pinned memory and
    events are slow to allocate, and a step's host time is what overlapped scheduling hides: they
    are made once, not per step."""

    def __init__(self, device: torch.device, max_tokens: int) -> None:
        self._buffers = [torch.empty(max_tokens, dtype=torch.long, pin_memory=True) for _ in range(2)]
        self._events = [torch.cuda.Event() for _ in range(2)]
        self._stream = torch.cuda.current_stream(device)
        self._next = 0

    def start(self, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Copy `sampled` (int64, device) to the host without waiting: (its host buffer, an event
        recorded after the copy)."""
        host = self._buffers[self._next][: sampled.shape[0]]
        host.copy_(sampled, non_blocking=True)
        return host, self.recorded()

    def recorded(self) -> torch.cuda.Event:
        """An event recorded after the work launched so far, taken in turn with the buffers; alone,
        for tokens that the device writes to host memory itself (a decode graph's)."""
        i, self._next = self._next, self._next ^ 1
        self._events[i].record(self._stream)
        return self._events[i]


@dataclass(frozen=True, slots=True)
class VerifyPlan:
    """What the host decided as it launched a speculative step with synthetic acceptance (before
    the device ran it): per request in batch order, how many drafts it verified and how many of
    them it accepts, and the bank of the step's placeholders. The step's sampled tensor holds the
    verifying requests' emitted tokens, then as many next drafts each."""

    num_drafts: list[int]
    accepted: list[int]
    bank: int


@dataclass
class LaunchedStep:
    """A step on the device: its batch, where each request's placeholder sits in its token_ids
    (-1: the request samples nothing this step), and the sampled tokens (device tensor, None when
    nothing samples), copied to the host asynchronously as soon as they are launched (through
    `copies`, for tokens on a GPU), unless the device writes them to the host itself (`on_host`:
    a decode graph's greedy tokens). A speculative step carries its `verify` plan; its
    placeholder_at is where each request's first new token sits."""

    batch: ScheduledBatch
    placeholder_at: list[int]
    sampled: torch.Tensor | None
    copies: InitVar[TokenCopies | None] = None
    on_host: InitVar[torch.Tensor | None] = None
    verify: VerifyPlan | None = None
    _host: torch.Tensor | None = field(default=None, init=False)
    _ready: torch.cuda.Event | None = field(default=None, init=False)

    def __post_init__(self, copies: TokenCopies | None, on_host: torch.Tensor | None) -> None:
        if self.sampled is None or self.sampled.device.type == "cpu":
            self._host = self.sampled
            return
        if copies is None:
            raise ValueError("LaunchedStep: tokens sampled on a GPU need the engine's TokenCopies")
        # the step's one device-to-host copy, or none
        self._host, self._ready = copies.start(self.sampled) if on_host is None else (on_host, copies.recorded())

    def tokens(self) -> list[int]:
        """The sampled tokens in batch order of the requests that sample; waits for the copy only."""
        if self._ready is not None:
            self._ready.synchronize()
        return [] if self._host is None else self._host.tolist()
