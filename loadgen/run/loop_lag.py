"""Event-loop lag monitor: how late the client's own loop wakes a periodic timer.

A loaded client delays every timestamp it takes; a lag of milliseconds means the measured
latencies include client time and the client, not the server, may be the bottleneck.

The timer's callback measures and re-arms itself: no task, future or coroutine step per wake-up
(a task's sleep costs several times a bare timer callback on a busy loop).

Every 20 ms, not faster: the wake-ups themselves are client CPU, and a timer a few times faster
costs a share of it that shows in the client's CPU per streamed token
(`benchmarks/client_overhead.py --conc 256` reports it). A blocked loop still shows as the next
wake-up's lateness; blocks shorter than the interval are sampled, not all seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

INTERVAL_S = 0.02
WARN_P99_US = 5_000  # above this the report warns that the client may be the bottleneck


class LoopLagMonitor:
    """From its creation (inside a running loop) until `cancel()`, passes each wake-up's lateness
    in microseconds to `sink`."""

    def __init__(self, sink: Callable[[int], None], interval_s: float = INTERVAL_S) -> None:
        self._loop = asyncio.get_running_loop()
        self._sink = sink
        self._interval_s = interval_s
        self._interval_ns = int(interval_s * 1e9)
        self._expected = time.perf_counter_ns() + self._interval_ns
        self._handle = self._loop.call_later(interval_s, self._wake)

    def _wake(self) -> None:
        now = time.perf_counter_ns()
        self._sink((now - self._expected) // 1000)
        self._expected = now + self._interval_ns
        self._handle = self._loop.call_later(self._interval_s, self._wake)

    def cancel(self) -> None:
        self._handle.cancel()
