"""The loop-lag monitor: each wake-up's lateness, from a timer callback that re-arms itself."""

from __future__ import annotations

import asyncio
import time

from loadgen.run.loop_lag import LoopLagMonitor


def test_a_blocked_loop_shows_as_the_timers_lateness_and_cancel_stops_it():
    async def main() -> list[int]:
        lags: list[int] = []
        monitor = LoopLagMonitor(lags.append, interval_s=0.005)
        await asyncio.sleep(0.03)
        time.sleep(0.05)  # the loop cannot wake the timer meanwhile
        await asyncio.sleep(0.02)
        monitor.cancel()
        seen = len(lags)
        await asyncio.sleep(0.03)
        assert len(lags) == seen  # cancelled: no more wake-ups
        return lags

    lags = asyncio.run(main())
    assert len(lags) >= 4
    assert max(lags) >= 40_000  # the 50 ms block, less the 5 ms the timer had to wait anyway
    assert min(lags) >= -1_000  # a timer never wakes (much) early
