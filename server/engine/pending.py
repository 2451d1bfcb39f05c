"""A launched step whose sampled tokens are still on their way to the host (overlapped scheduling).

With overlapped scheduling the engine schedules and launches step N+1 before it reads step N's
tokens, so the host's work for N+1 runs while the device computes N. A request that samples in
step N gets a placeholder in its `token_ids` until the token is back: -1 - row, where row is
the token's row in step N's sampled-token tensor (`placeholder` in server/engine/sequence.py).
Step N+1 embeds the real token by gathering it from that tensor on the device
(`fill_placeholders`), so the token never makes a round trip through the host before it is
used. Placeholders only ever refer to the step launched just before: a step's tokens are
resolved before the step after next is scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from server.engine.scheduler import ScheduledBatch


def to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied from pinned memory so the host does not wait (a copy
    from pageable memory, as torch.tensor(..., device=cuda) makes, waits for the device)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def fill_placeholders(token_ids: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """token_ids (device) with every placeholder replaced by its row of `sampled`; no host sync."""
    rows = (-1 - token_ids).clamp_(min=0)
    return torch.where(token_ids < 0, sampled[rows], token_ids)


@dataclass
class LaunchedStep:
    """A step on the device: its batch, where each request's placeholder sits in its token_ids
    (-1: the request samples nothing this step), and the sampled tokens (device tensor, None when
    nothing samples), copied to the host asynchronously as soon as they are launched."""

    batch: ScheduledBatch
    placeholder_at: list[int]
    sampled: torch.Tensor | None
    _host: torch.Tensor | None = field(default=None, init=False)
    _ready: torch.cuda.Event | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.sampled is None or self.sampled.device.type == "cpu":
            self._host = self.sampled
            return
        # The step's one device-to-host copy: into pinned memory, without waiting for it.
        self._host = torch.empty(self.sampled.shape, dtype=self.sampled.dtype, pin_memory=True)
        self._host.copy_(self.sampled, non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record()

    def tokens(self) -> list[int]:
        """The sampled tokens in batch order of the requests that sample; waits for the copy only."""
        if self._ready is not None:
            self._ready.synchronize()
        return [] if self._host is None else self._host.tolist()
