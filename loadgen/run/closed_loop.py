"""The closed loop: N lanes, each playing one session tree after another until the window closes.

A lane's plays come from `plan.LanePlays` (sessions and offsets fixed by seed and lane, the same at
every level; salts by the level too), its first play starts at a seeded offset after re-sending
that request's context as warm-up, which a later level finds cached. Every level starts its
lanes afresh, a capacity search's probes too: lanes that went on with their sessions from one
level into the next would move ever later into them, where contexts are longer, and measure a
heavier load than a level of its own at that concurrency. Within a play the parent
requests wait their think times and the subagents they join (plan.py); subagents run their own
chains beside the parent.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from loadgen.run import plan
from loadgen.run.level import LevelRun, RequestMeta, RunConfig
from loadgen.run.plan import LanePlays, Play
from traces import TraceSet

if TYPE_CHECKING:
    from loadgen.run.runner import Runner


def plays_of(traces: TraceSet, config: RunConfig, level_index: int, concurrency: int) -> LanePlays:
    """The level's plays; a warm-up that re-sends the start requests primes the lanes' histories,
    which later levels then share (plan.LanePlays)."""
    return LanePlays(traces.sessions, config.seed, level_index, concurrency, config.start_offset,
                     shared_history=config.warmup.primes)


async def run(runner: Runner, level: LevelRun, level_index: int) -> None:
    config, n = runner.config, level.load.lanes
    plays = plays_of(runner.traces, config, level_index, n)
    lanes = [runner.spawn(_lane(runner, level, plays, lane)) for lane in runner.share.lanes(n)]
    if config.warmup.requests in (None, 0):
        await runner.sleep_until(level, level.started_ns + int(config.warmup.seconds * 1e9))
        if not level.stopping and level.window_start_ns is None:
            level.open_window(config.window_of(level.load), level.started_ns + int(config.warmup.seconds * 1e9))
    await _hold_window(runner, level)
    await runner.drain(lanes)


def warmup_plan(plays: LanePlays, lanes: int, warm_requests: int | None) -> tuple[int, int]:
    """(distinct sessions of the lanes' first plays, prompt tokens their warm-up sends): each lane
    re-sends the context at its start offset, then (with --warmup Nreq) the requests after it."""
    sessions, tokens = set(), 0
    for lane in range(lanes):
        play = plays.play(lane, 0)
        sessions.add(play.session.id)
        warm = play.session.requests[play.start_index:play.start_index + max(1, warm_requests or 0)]
        tokens += sum(r.input_tokens for r in warm)
    return len(sessions), tokens


async def _hold_window(runner: Runner, level: LevelRun) -> None:
    """Wait until the window has opened and closed (or the level was stopped)."""
    await level.window_opened_or_stopped()
    if level.window_end_ns is not None:
        await runner.sleep_until(level, level.window_end_ns)
    if not level.stopping:
        level.stop.set_result(None)


async def _lane(runner: Runner, level: LevelRun, plays: LanePlays, lane: int) -> None:
    round_ = 0
    while not level.stopping:
        sent = level.lane_requests[lane]
        await _play_tree(runner, level, plays.play(lane, round_), lane, warm_first=round_ == 0)
        round_ += 1
        if level.lane_requests[lane] == sent:
            await asyncio.sleep(0.001)  # a play with nothing to send: never spin


async def _play_tree(runner: Runner, level: LevelRun, play: Play, lane: int, warm_first: bool) -> None:
    session = play.session
    level.active_trees += 1
    level.max_active_trees = max(level.max_active_trees, level.active_trees)
    subagents: dict[int, asyncio.Task] = {}
    try:
        if play.start_index == 0:
            _launch_subagents(runner, level, play, lane, 0, subagents, _now_s())
        prev_end = _now_s()
        for position in range(play.start_index, len(session.requests)):
            request = session.requests[position]
            if position > play.start_index:
                ready = prev_end + request.think_time  # already scaled/capped by traces.scale_traces
                for number, gap in plan.joins_before(session, position):
                    if number in subagents:
                        ready = max(ready, await subagents[number] + runner.timing.scaled(gap))
                if not await runner.sleep_until(level, int(ready * 1e9)):
                    break
            if level.stopping:
                break
            warm = warm_first and position == play.start_index
            if not await runner.send(level, RequestMeta(play.play_id, session.id, "", request, lane), play.salt,
                                     warm=warm, history=play.history):
                break
            prev_end = _now_s()
            _launch_subagents(runner, level, play, lane, position + 1, subagents, prev_end)
        if subagents:
            await asyncio.wait(list(subagents.values()))
    finally:
        # A lane cancelled by a drain timeout takes its subagents with it: none may go on
        # sending into a level that is already summarised.
        pending = [task for task in subagents.values() if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        level.active_trees -= 1


def _launch_subagents(runner: Runner, level: LevelRun, play: Play, lane: int, after: int, tasks: dict,
                      anchor_s: float) -> None:
    for number in plan.subagents_after(play.session, after):
        tasks[number] = runner.spawn(_subagent(runner, level, play, lane, number, anchor_s))


async def _subagent(runner: Runner, level: LevelRun, play: Play, lane: int, number: int, anchor_s: float) -> float:
    """Play one subagent's request chain; returns when it ended (perf_counter seconds)."""
    sub = play.session.subagents[number]
    ready = anchor_s + plan.subagent_delay(play.session, sub, runner.timing)
    for i, request in enumerate(sub.requests):
        if i:
            ready = _now_s() + request.think_time
        if not await runner.sleep_until(level, int(ready * 1e9)):
            break
        await runner.send(level, RequestMeta(play.play_id, play.session.id, sub.agent_id, request, lane), play.salt,
                          history=play.history)
    return _now_s()


def _now_s() -> float:
    return time.perf_counter_ns() / 1e9
