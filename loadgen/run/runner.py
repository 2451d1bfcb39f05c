"""The level runner: runs one level at a time (warm-up, measurement window, drain) and times and
accounts every request it sends.

Closed loop (`LevelLoad.concurrency`, loadgen/run/closed_loop.py): N lanes, each playing one session
tree at a time (see plan.py for the timing of a play). Open loop (`rate` or Mooncake timestamps,
loadgen/run/open_loop.py): requests start at their intended times whatever the server does, and
latency counts from the intended time.

A request counts when it started inside the window (open loop: was *due* inside it) and is not
a warm-up resend; after the window no new request starts, and the ones in flight finish (each
is bounded by the per-request timeout). Failures are counted by kind. A server that refuses
`DEAD_AFTER` connections in a row with no success between ends the run; so does `interrupt()`
(Ctrl-C), and so does a warm-up that outlasts `RunConfig.warmup_timeout_s`. Either way the
levels measured so far, and the partial one, are kept.

Requests are prepared a few per event-loop turn (loadgen/run/pacer.py), so a burst of lanes
finishing together never keeps the loop from reading its sockets.

A worker process (loadgen/run/workers.py) runs a `Runner` over its `Share` of the level; with
`coordinated` the window of a requests-counted warm-up is opened by the parent (`open_window`)
once every worker's lanes are warm, so all shares measure the same window.

Repeats (`--repeat N`): a level index run again replays the same plan - the same sessions, start
offsets and think times, so every repeat's window measures the same (session, turn) requests and
repeats can be compared request by request (loadgen/compare). Only the prompts' salt changes per
repeat: the server's prefix cache holds the earlier repeat's prompts, and reusing them would make
every later repeat a cache-warm copy of the first instead of a repeat of it. The lanes' primed
histories (plan.History) keep their salts: the context each lane starts from is the same one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from loadgen.results.attainment import SloTally
from loadgen.run import closed_loop, open_loop
from loadgen.run.level import LevelLoad, LevelRun, RequestMeta, RunConfig, Share
from loadgen.run.loop_lag import LoopLagMonitor
from loadgen.run.pacer import Pacer
from loadgen.run.plan import SALT_BITS, History, TimingConfig
from loadgen.run.spec_decode import SpecCounters, SpecExpectation
from loadgen.run.summary import request_record
from loadgen.transport.base import ErrorKind, Exchange, Transport, WireRequest
from traces import PromptSynth, TraceSet

log = logging.getLogger(__name__)
DEAD_AFTER = 5  # consecutive refused connections that mean the server is gone
TIMER_RESOLUTION_S = 0.001  # event-loop timers (libuv) count milliseconds
WHOLE_LEVEL = Share()  # the default share: one worker plays the whole level
REPEAT_SALT_STEP = 0x9E3779B97F4A7C15  # odd: the repeats' salts are distinct for any salt


class Runner:
    def __init__(
        self,
        transport: Transport,
        traces: TraceSet,
        synth: PromptSynth,
        config: RunConfig,
        on_request: Callable[[dict[str, Any]], None] | None = None,
        spec: SpecExpectation | None = None,
        share: Share = WHOLE_LEVEL,
        coordinated: bool = False,
    ) -> None:
        self.transport = transport
        self.traces = traces
        self.synth = synth
        self.config = config
        self.on_request = on_request
        self.spec = spec
        self.share = share
        self.coordinated = coordinated
        self.status = "complete"
        self.message: str | None = None
        self.current: LevelRun | None = None
        self.levels_run = 0
        self._consecutive_refused = 0
        self._tasks: set[asyncio.Task] = set()
        self._request_numbers = itertools.count()
        self._pacer = Pacer()
        self._runs_of_index: dict[int, int] = {}
        self._salt_shift = 0  # the current level's repeat, folded into every prompt's salt

    @property
    def timing(self) -> TimingConfig:
        return self.config.timing

    # -- control -----------------------------------------------------------------------------

    def interrupt(self, status: str = "interrupted", message: str | None = None) -> None:
        """Stop the run now: the current level keeps what it measured; in-flight requests are cut."""
        if self.status == "complete":
            self.status, self.message = status, message
        level = self.current
        if level is not None and not level.stopping:
            level.stop.set_result(None)
        for task in list(self._tasks):
            task.cancel()

    @property
    def stopped(self) -> bool:
        return self.status != "complete"

    def end_window(self) -> None:
        """End the current level's window now (a decided capacity probe): the requests started
        in it finish and count; no new one starts."""
        level = self.current
        if level is None or level.window_start_ns is None or level.stopping:
            return
        now = time.perf_counter_ns()
        if level.window_end_ns is None or level.window_end_ns > now:
            level.window_end_ns = now
        level.stop.set_result(None)

    def open_window(self, start_ns: int | None = None) -> None:
        """The parent's signal (coordinated runs) that every share's lanes are warm."""
        level = self.current
        if level is not None and level.window_start_ns is None and not level.stopping:
            level.open_window(self.config.window_of(level.load), start_ns)

    async def wait_warm(self) -> None:
        """Until the current level's lanes are all warm (or the level stopped)."""
        while self.current is None:
            await asyncio.sleep(TIMER_RESOLUTION_S)
        level = self.current
        await asyncio.wait({level.lanes_ready, level.stop}, return_when=asyncio.FIRST_COMPLETED)

    async def run_level(self, load: LevelLoad, level_index: int | None = None,
                        started_ns: int | None = None) -> LevelRun:
        """Run one level; `level_index` (default: levels run so far) keys its plan, `started_ns`
        (default: now) is its common start when several workers share it. An index run before is
        a repeat: the same plan with fresh prompt salts."""
        index = self.levels_run if level_index is None else level_index
        self.levels_run = index + 1
        repeat = self._runs_of_index.get(index, 0)
        self._runs_of_index[index] = repeat + 1
        self._salt_shift = (repeat * REPEAT_SALT_STEP) & ((1 << SALT_BITS) - 1)
        level = LevelRun(load, time.perf_counter_ns() if started_ns is None else started_ns)
        if self.config.live_slo is not None:
            level.slo_tally = SloTally(self.config.live_slo)
        if load.mode == "closed" and not self.share.lanes(load.lanes):
            level.lanes_ready.set_result(None)  # more workers than lanes: this one has none to warm
        self.current = level
        def record_lag(us: int) -> None:
            if level.in_window(time.perf_counter_ns()):
                level.recorder.record_loop_lag(us)

        lag = LoopLagMonitor(record_lag)
        scrape = asyncio.create_task(self._scrape_at_window_start(level)) if self.share.index == 0 else None
        watchdog = asyncio.create_task(self._warmup_watchdog(level))
        try:
            if load.mode == "closed":
                await closed_loop.run(self, level, index)
            else:
                await open_loop.run(self, level, index)
            if scrape is not None and await scrape:  # after the drain: the window's requests are all in the delta
                level.record_scrape(await self.transport.server_counters())
        finally:
            for task in (scrape, lag, watchdog):
                if task is not None:
                    task.cancel()
            level.close_window()
            self.current = None
        return level

    async def _warmup_watchdog(self, level: LevelRun) -> None:
        limit = self.config.warmup_timeout_s
        await self.sleep_until(level, level.started_ns + int(limit * 1e9))
        if level.window_start_ns is None and not level.stopping:
            self.interrupt("failed", f"{level.load.label}: the warm-up did not finish within --warmup-timeout "
                           f"{limit:g} s ({level.warmup_ok} warm-up requests done, {level.inflight} in flight); "
                           "the server is slower than the warm-up needs: raise --warmup-timeout, or shorten "
                           "--warmup or the sessions (--token-scale)")

    async def _scrape_at_window_start(self, level: LevelRun) -> bool:
        """Server-wide counters when the window opens (the AL fallback when usage has none, our
        server's kernel compiles); False when the level ended before its window opened."""
        await level.window_opened_or_stopped()
        if level.window_start_ns is None:
            return False
        level.record_scrape(await self.transport.server_counters())
        return True

    # -- one request -------------------------------------------------------------------------

    async def send(self, level: LevelRun, meta: RequestMeta, salt: int, warm: bool = False,
                   due_ns: int | None = None, history: History | None = None) -> bool:
        """Send one request and account for it; False when it was not sent (the window had closed).
        `history`: the primed context its play starts from (plan.History), drawn with its own salt."""
        if not self._pacer.take():  # no room in this loop turn: wait for one
            await self._pacer.turn()
        origin = due_ns if due_ns is not None else time.perf_counter_ns()
        if not warm and level.window_closed(origin):
            return False  # a lane woken late by a busy loop: no request starts after the window
        request = meta.request
        al = self.spec.al(request) if self.spec is not None else None
        number = next(self._request_numbers)
        wire = WireRequest(
            request_id=f"{meta.play_id}-{meta.agent or 'main'}-{request.index}-{self.share.index}.{number}",
            prompt=self.synth.prompt(meta.session, request, salt ^ self._salt_shift,
                                     None if history is None else (history.salt, history.hash_ids)),
            max_tokens=request.output_tokens,
            user=f"agentload-{meta.play_id}",
            acceptance_length=al if self.spec is not None and self.spec.send else None,
        )
        counted = not warm and level.in_window(origin)
        level.request_started(number, origin)
        try:
            exchange = await self.transport.send(wire)
        except asyncio.CancelledError:
            if counted:
                level.count_error(ErrorKind.CANCELLED, meta.play_id, True)
            if self.on_request is not None:  # the per-request file keeps every counted error
                cancelled = Exchange(start_ns=origin, end_ns=time.perf_counter_ns(), error=ErrorKind.CANCELLED,
                                     error_detail="cancelled when the level stopped")
                self.on_request(request_record(level, meta, wire.request_id, cancelled, origin, counted, al))
            raise
        finally:
            level.request_ended(number, time.perf_counter_ns())
        if due_ns is None and exchange.start_ns:
            # Closed loop: latency starts when the request reached the wire, so the client's own
            # prompt synthesis and body encoding never count as server time.
            origin = exchange.start_ns
        try:
            self._account(level, meta, wire.request_id, exchange, origin, counted, due_ns is not None, al)
        except Exception as exc:  # loadgen's own failure: counted against the request, and the run stops
            self._client_failed(exc, f"accounting for request {wire.request_id}")
            if counted:
                level.count_error(ErrorKind.CLIENT, meta.play_id, True)
        return True

    def _account(self, level: LevelRun, meta: RequestMeta, wire_id: str, ex: Exchange, origin: int, counted: bool,
                 open_loop: bool, al: float | None) -> None:
        level.lane_requests[meta.lane] += 1
        if ex.error is None:
            self._consecutive_refused = 0
        else:
            self._watch_server(ex)
        if ex.error:
            level.count_error(ex.error, meta.play_id, counted)
        elif not counted:
            level.warmup_ok += 1
        else:
            self._measure(level, meta, ex, origin, open_loop)
            if al is not None or ex.spec_num_drafts is not None:  # else nothing to tally
                usage = (None if ex.spec_num_drafts is None
                         else SpecCounters(ex.spec_num_drafts, ex.spec_num_accepted_tokens or 0))
                level.spec_tally.add(al, ex.output_tokens, usage)
        if level.window_start_ns is None:  # a requests-counted warm-up opens the window once done
            self._maybe_open_window_after_warmup_requests(level, meta.lane)
        if self.on_request is not None:
            try:
                self.on_request(request_record(level, meta, wire_id, ex, origin, counted, al))
            except Exception as exc:  # the request itself was counted above: only the run fails
                self._client_failed(exc, "writing the per-request file")

    def _measure(self, level: LevelRun, meta: RequestMeta, ex: Exchange, origin: int, open_loop: bool) -> None:
        request = meta.request
        osl = ex.output_tokens
        counted = ex.counted_tokens
        chunk_ns = ex.chunk_ns
        ttft_us = (chunk_ns[0] - origin) // 1000
        e2el_us = (chunk_ns[-1] - origin) // 1000
        rec = level.recorder
        tpot_us = rec.record_latencies(ttft_us, e2el_us, osl, chunk_ns, ex.chunk_tokens)
        if open_loop:
            rec.record_queue_delay((ex.start_ns - origin) // 1000)
        start_ms = round((origin - (level.window_start_ns or origin)) / 1e6, 3)
        if level.slo_tally is not None:
            level.slo_tally.add(meta.play_id, ttft_us, e2el_us, tpot_us, osl, start_ms)
        level.ok += 1
        input_tokens = request.input_tokens
        level.input_tokens += input_tokens
        level.output_tokens += osl
        level.counted_tokens += counted
        if ex.usage_completion_tokens is not None and ex.usage_completion_tokens != counted:
            level.usage_mismatches += 1
        if ex.cached_tokens is not None:
            level.cached_tokens += ex.cached_tokens
            level.cached_input_tokens += input_tokens
            level.cached_reported += 1
        level.session_input_tokens[meta.session] += input_tokens
        cols = level.columns
        cols["play"].append(meta.play_id)
        cols["session"].append(meta.session)
        cols["agent"].append(meta.agent)
        cols["turn"].append(request.index)
        cols["isl"].append(input_tokens)
        cols["osl"].append(osl)
        cols["ttft_us"].append(ttft_us)
        cols["e2el_us"].append(e2el_us)
        cols["tpot_us"].append(tpot_us)
        cols["start_ms"].append(start_ms)

    def _maybe_open_window_after_warmup_requests(self, level: LevelRun, lane: int) -> None:
        wanted = self.config.warmup.requests
        if level.load.mode != "closed" or not wanted or level.window_start_ns is not None:
            return
        if level.lane_requests[lane] == wanted:
            level.lanes_warm += 1
            if level.lanes_warm == len(self.share.lanes(level.load.lanes)):
                if self.coordinated:
                    level.lanes_ready.set_result(None)  # the parent opens the window for every share
                else:
                    level.open_window(self.config.window_of(level.load))

    def _watch_server(self, ex: Exchange) -> None:
        """A failed request (a success resets the count): refused connections in a row end the run."""
        if ex.error != ErrorKind.CONNECT:
            return
        self._consecutive_refused += 1
        if self._consecutive_refused >= DEAD_AFTER and not self.stopped:
            self.interrupt("server_dead", f"the server refused {DEAD_AFTER} connections in a row "
                           f"({ex.error_detail}); stopping with the results measured so far")

    # -- helpers for the loops ---------------------------------------------------------------

    def spawn(self, coro) -> asyncio.Task:
        """A lane, subagent or request task, supervised: one that raises stops the run, counted."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        level = self.current
        if level is not None:
            level.errors[ErrorKind.CLIENT] += 1  # the request the task was about to send, or sending
        self._client_failed(task.exception(), "a client task")

    def _client_failed(self, exc: BaseException | None, where: str) -> None:
        """loadgen failed (a bug, or a resource such as a full disk): logged with its traceback, and the
        run stops as failed with what it measured kept; the message names it."""
        log.error("loadgen failed in %s", where, exc_info=exc)
        self.interrupt("failed", f"loadgen failed in {where}: {type(exc).__name__}: {exc}")

    async def sleep_until(self, level: LevelRun, deadline_ns: int) -> bool:
        """Sleep until `deadline_ns` (perf_counter), never waking before it (the loop's timers
        have millisecond resolution and may fire early); False when the level stopped meanwhile."""
        while not level.stopping:
            delay = (deadline_ns - time.perf_counter_ns()) / 1e9
            if delay <= 0:
                break
            await asyncio.wait({level.stop}, timeout=max(delay, TIMER_RESOLUTION_S))
        return not level.stopping

    async def drain(self, tasks: list[asyncio.Task]) -> None:
        """Requests in flight finish; each is bounded by the timeout, so this is too."""
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.config.timeout_s + 5)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
