"""A level's results entry: the client warnings, and the merge of several workers' spec tallies."""

from __future__ import annotations

import asyncio
import pickle

from loadgen.level import LevelLoad, LevelRun, RunConfig, Warmup
from loadgen.plan import TimingConfig
from loadgen.spec import SpecCounters, SpecTally
from loadgen.summary import level_summary

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


def test_spec_tallies_merge_field_by_field_and_keep_the_scraped_counters():
    scraped = [SpecCounters(10, 20), SpecCounters(30, 70)]
    total = SpecTally()
    total.merge(pickle.loads(pickle.dumps(SpecTally(1.5, 2, 3, 4, 5, scraped))))  # as a worker sends it
    total.merge(SpecTally(0.5, 1, 1, 2, 3, []))
    assert total == SpecTally(2.0, 3, 4, 6, 8, scraped)
