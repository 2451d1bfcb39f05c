"""Event-loop lag monitor: how late the client's own loop wakes a periodic timer.

A loaded client delays every timestamp it takes; a lag of milliseconds means the measured
latencies include client time and the client, not the server, may be the bottleneck.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

INTERVAL_S = 0.005
WARN_P99_US = 5_000  # above this the report warns that the client may be the bottleneck


async def monitor_loop_lag(sink: Callable[[int], None], interval_s: float = INTERVAL_S) -> None:
    """Run until cancelled, passing each wake-up's lateness in microseconds to `sink`."""
    interval_ns = int(interval_s * 1e9)
    expected = time.perf_counter_ns() + interval_ns
    while True:
        await asyncio.sleep(interval_s)
        now = time.perf_counter_ns()
        sink((now - expected) // 1000)
        expected = now + interval_ns
