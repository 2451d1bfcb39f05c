"""A level's results entry: the client warnings, and the merge of several workers' spec tallies."""

from __future__ import annotations

import asyncio
import pickle
import time

from loadgen.run.level import LevelLoad, LevelRun, RunConfig, Warmup, wall_clock_at
from loadgen.run.plan import TimingConfig
from loadgen.run.spec_decode import SpecCounters, SpecTally
from loadgen.run.summary import level_summary

CONFIG = RunConfig(duration_s=10.0, warmup=Warmup(), timing=TimingConfig())


def _client_warnings(cpu_s: float, engine_in_process: bool) -> list[str]:
    async def summarise() -> list[str]:
        level = LevelRun(LevelLoad("closed", concurrency=1), 0)
        level.window_start_ns, level.window_end_ns = 0, int(10e9)
        level.cpu_s, level.sys_s = cpu_s, 0.0
        return level_summary(level, CONFIG, None, engine_in_process=engine_in_process)["client"]["warnings"]

    return asyncio.run(summarise())


def test_a_busy_client_core_is_a_warning_that_points_at_workers():
    warnings = _client_warnings(cpu_s=9.5, engine_in_process=False)
    assert len(warnings) == 1 and "95% of a core" in warnings[0] and "--workers" in warnings[0]
    assert _client_warnings(cpu_s=5.0, engine_in_process=False) == []


def test_no_busy_core_warning_when_the_engine_shares_the_process():
    # bench: the process's CPU time is mostly the engine's, and bench has no --workers
    assert _client_warnings(cpu_s=9.5, engine_in_process=True) == []


def _lag_warnings(preempted: int, workers: int = 1, engine_in_process: bool = False) -> list[str]:
    """The warnings of a 10 s window whose loop lagged 20 ms at p99 and whose processes were taken
    off their cores `preempted` times in all."""
    async def summarise() -> list[str]:
        level = LevelRun(LevelLoad("closed", concurrency=1), 0)
        level.window_start_ns, level.window_end_ns = 0, int(10e9)
        level.cpu_s, level.sys_s, level.preempted, level.workers = 1.0, 0.0, preempted, workers
        for _ in range(100):
            level.recorder.record_loop_lag(20_000)
        summary = level_summary(level, CONFIG, None, engine_in_process=engine_in_process)["client"]
        assert summary["preempted_per_s"] == preempted / 10
        return summary["warnings"]

    return asyncio.run(summarise())


def test_a_lagging_loop_on_a_shared_core_says_so():
    (warning,) = _lag_warnings(preempted=800)
    assert "lagged (p99 20.0 ms)" in warning and "took the client's core 80 times a second" in warning
    (warning,) = _lag_warnings(preempted=800, workers=8)  # 10 a second per worker: the loop's own doing
    assert "lagged" in warning and "core" not in warning
    (warning,) = _lag_warnings(preempted=800, engine_in_process=True)  # bench: the engine's thread too
    assert "lagged" in warning and "core" not in warning


def test_workers_preemptions_add_up():
    async def merged() -> int | None:
        total = LevelRun(LevelLoad("closed", concurrency=2), 0)
        for preempted in (3, 4):
            part = LevelRun(LevelLoad("closed", concurrency=2), 0)
            part.window_start_ns, part.window_end_ns = 0, int(10e9)
            part.cpu_s, part.sys_s, part.preempted = 1.0, 0.0, preempted
            total.absorb(pickle.loads(pickle.dumps(part.export())))
        return total.preempted

    assert asyncio.run(merged()) == 7


def test_spec_tallies_merge_field_by_field_and_keep_the_scraped_counters():
    scraped = [SpecCounters(10, 20), SpecCounters(30, 70)]
    total = SpecTally()
    total.merge(pickle.loads(pickle.dumps(SpecTally(1.5, 2, 3, 4, 5, scraped))))  # as a worker sends it
    total.merge(SpecTally(0.5, 1, 1, 2, 3, []))
    assert total == SpecTally(2.0, 3, 4, 6, 8, scraped)


def test_a_perf_counter_reading_lands_on_the_wall_clock():
    now_perf, now_wall = time.perf_counter_ns(), time.time()
    assert abs(wall_clock_at(now_perf) - now_wall) < 0.05
    assert abs(wall_clock_at(now_perf - 2_000_000_000) - (now_wall - 2.0)) < 0.05
