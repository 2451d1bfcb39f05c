"""Request preparation paced to a few per event-loop turn.

Preparing a request (prompt synthesis, body encoding, accounting of the one before) costs tens
to hundreds of microseconds. When many lanes finish at once (a closed loop in lockstep against
a server with uniform timing), all of them would prepare their next request in one loop turn,
and no socket is read meanwhile: the events that queue in that time are coalesced by the kernel
and all get the newest arrival stamp (loadgen/transport/raw_socket.py), which smears TTFT and ITL.
With the pacer at most `per_turn` requests are prepared between two runs of its callback (one a
loop turn), and the loop polls the sockets between turns. `per_turn` follows what a preparation
costs: a full-length agentic prompt (hundreds of KB) is slow enough to synthesise and encode that
a fixed count per turn would keep the loop from its sockets for longer than the gap between a
stream's chunks, stamping them late. So a turn takes as many as fit in `budget_s` at the measured
cost, from one to `max_per_turn`. The cost is the time from one release to the next over the
requests it released (they run in between; whatever else ran in that turn counts too, which errs
toward fewer per turn). A request that finds room and no one waiting goes on at once (`take`: no
future, no task switch, the usual case when lanes finish
apart); the others wait their turn, first come, first served. A closed-loop request's latency
starts when it reaches the wire, so the pacing never counts as server time; in the open loop it
shows as `queue_delay`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

PER_TURN = 8  # requests prepared per loop turn at most, when preparing is cheap
BUDGET_S = 0.002  # work a turn may hold before the loop polls its sockets again
COST_WEIGHT = 0.2  # the newest turn's share of the running cost estimate


class Pacer:
    def __init__(self, per_turn: int = PER_TURN, budget_s: float = BUDGET_S) -> None:
        self.max_per_turn = per_turn
        self.per_turn = per_turn
        self.budget_s = budget_s
        self.cost_s = 0.0  # running estimate of one preparation's time (0: none measured yet)
        self._waiting: deque[asyncio.Future] = deque()
        self._scheduled = False  # a _release is due in the next loop turn
        self._gone = 0  # requests gone on since the last _release (or released by it, going on next)
        self._released_at = 0.0  # when the last _release let `_released` waiters go
        self._released = 0

    def take(self) -> bool:
        """Go on now (True) when this turn has room and no one waits; else `await turn()`."""
        if self._gone >= self.per_turn or self._waiting:
            return False
        self._gone += 1
        self._schedule()
        return True

    async def turn(self) -> None:
        """Return in a later loop turn, with at most `per_turn` others going on in the same one."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._schedule()
        await future

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        now = time.perf_counter()
        if self._released:  # the last release's requests ran since: what each cost
            self._measure((now - self._released_at) / self._released)
        waiting = self._waiting
        released = 0
        while waiting and released < self.per_turn:
            future = waiting.popleft()
            if not future.done():  # a cancelled waiter (its level stopped) takes no slot
                future.set_result(None)
                released += 1
        self._gone = released  # they go on in the next turn: room left there for `take`
        self._released_at, self._released = now, released
        if released:
            asyncio.get_running_loop().call_soon(self._release)
        else:
            self._scheduled = False

    def _measure(self, cost_s: float) -> None:
        self.cost_s = cost_s if not self.cost_s else (1 - COST_WEIGHT) * self.cost_s + COST_WEIGHT * cost_s
        self.per_turn = max(1, min(self.max_per_turn, int(self.budget_s / max(self.cost_s, 1e-9))))
