"""Request preparation paced to a few per event-loop turn.

Preparing a request (prompt synthesis, body encoding, accounting of the one before) costs tens
to hundreds of microseconds. When many lanes finish at once (a closed loop in lockstep against
a server with uniform timing), all of them would prepare their next request in one loop turn,
and no socket is read meanwhile: the events that queue in that time are coalesced by the kernel
and all get the newest arrival stamp (loadgen/transport/wire.py), which smears TTFT and ITL.
With the pacer at most `per_turn` requests are prepared per turn, and the loop polls the
sockets between turns. A closed-loop request's latency starts when it reaches the wire, so the
pacing never counts as server time; in the open loop it shows as `queue_delay`.
"""

from __future__ import annotations

import asyncio
from collections import deque

PER_TURN = 8  # requests prepared per loop turn: a millisecond or two of work at most


class Pacer:
    def __init__(self, per_turn: int = PER_TURN) -> None:
        self.per_turn = per_turn
        self._waiting: deque[asyncio.Future] = deque()
        self._scheduled = False

    async def turn(self) -> None:
        """Return in a later loop turn, with at most `per_turn` others released in the same one."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append(future)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._release)
        await future

    def _release(self) -> None:
        waiting = self._waiting
        for _ in range(min(self.per_turn, len(waiting))):
            future = waiting.popleft()
            if not future.done():  # a cancelled waiter (its level stopped) takes no slot
                future.set_result(None)
        if waiting:
            asyncio.get_running_loop().call_soon(self._release)
        else:
            self._scheduled = False
