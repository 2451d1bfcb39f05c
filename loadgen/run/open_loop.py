"""The open loop: requests start at their intended times (Poisson arrivals at a rate, or a
Mooncake trace's recorded timestamps) whatever the server does; latency counts from the
intended time, so a server that falls behind shows its queue.

Every worker walks the same seeded arrival sequence and sends the arrivals its `Share` owns, so
the plan does not depend on how many workers there are; the window (after a warm-up of seconds
or of the first N arrivals) is the same in every worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

from loadgen.run import plan
from loadgen.run.level import LevelLoad, LevelRun, RequestMeta, RunConfig
from loadgen.run.plan import Play, PlaySource
from traces import Request, TraceSet

if TYPE_CHECKING:
    from loadgen.run.runner import Runner


def arrivals(
    traces: TraceSet, config: RunConfig, load: LevelLoad, level_index: int
) -> Iterator[tuple[float, Play, Request]]:
    """The level's (offset_s, play, request) sequence: the first level keeps the run's seed, later
    ones derive theirs from it, so every level sends fresh plays."""
    seed = config.seed if level_index == 0 else config.seed ^ (level_index * 0x9E3779B1)
    source = PlaySource(traces.sessions, seed, config.start_offset, first_id=level_index << 32)
    if load.mode == "poisson" and load.rate is not None:
        return plan.poisson_arrivals(source, load.rate, seed + int(load.rate * 1000))
    time_scale = config.time_scale if load.time_scale is None else load.time_scale
    return plan.timestamp_arrivals(source.next_play(first_of_lane=False), time_scale)


def warmup_prompt_tokens(traces: TraceSet, config: RunConfig, load: LevelLoad, level_index: int) -> int:
    """Prompt tokens of the warm-up arrivals when the warm-up counts requests (else 0: a warm-up
    of seconds sends what arrives in them)."""
    wanted = config.warmup.requests or 0
    total = 0
    for number, (_, _, request) in enumerate(arrivals(traces, config, load, level_index)):
        if number >= wanted:
            break
        total += request.input_tokens
    return total


async def run(runner: Runner, level: LevelRun, level_index: int) -> None:
    cfg, share = runner.config, runner.share
    warm_n = cfg.warmup.requests
    start = level.started_ns
    # a warm-up of seconds ends on the clock; one of N arrivals, when arrival N is due
    opens_ns = start + int(cfg.warmup.seconds * 1e9) if warm_n is None else None
    tasks: list[asyncio.Task] = []
    last_due = start
    for number, (offset, play, request) in enumerate(arrivals(runner.traces, cfg, level.load, level_index)):
        due = start + int(offset * 1e9)
        if level.window_start_ns is None and (number == warm_n or (opens_ns is not None and due >= opens_ns)):
            window_ns = due if opens_ns is None else opens_ns
            if not await runner.sleep_until(level, window_ns):
                break
            level.open_window(cfg.window_of(level.load), window_ns)
        if level.window_end_ns is not None and due >= level.window_end_ns:
            break
        last_due = due
        if not share.owns_arrival(number):
            continue
        if not await runner.sleep_until(level, due):
            break
        meta = RequestMeta(play.play_id, play.session.id, "", request, 0)
        tasks.append(runner.spawn(runner.send(level, meta, play.salt, due_ns=due)))
    else:
        # The trace ran out before the window closed: the window ends at the last arrival.
        if level.window_end_ns is not None:
            level.window_end_ns = max(level.window_start_ns or 0, min(level.window_end_ns, last_due + 1))
    if level.window_start_ns is None:
        level.open_window(0.0, last_due)
    if not level.stopping:
        level.stop.set_result(None)
    await runner.drain(tasks)
