"""The sweep runner: one level after another, each with warm-up, a measurement window and a drain.

Closed loop (`LevelSpec.concurrency`): N lanes, each playing one session tree at a time (see
plan.py for the timing of a play). Open loop (`rate` or Mooncake timestamps): requests start at
their intended times whatever the server does, and latency counts from the intended time.

A request counts when it started inside the window (open loop: was *due* inside it) and is not
a warm-up resend; after the window no new request starts, and the ones in flight finish (each
is bounded by the per-request timeout). Failures are counted by kind. A server that refuses
`DEAD_AFTER` connections in a row with no success between ends the run; so does `interrupt()`
(Ctrl-C). Either way the levels measured so far, and the partial one, are kept.
"""

from __future__ import annotations

import asyncio
import itertools
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import orjson

from loadgen import plan
from loadgen.loop_lag import WARN_P99_US, monitor_loop_lag
from loadgen.metrics import LevelRecorder
from loadgen.plan import Play, PlaySource, TimingConfig
from loadgen.spec import SpecCounters, SpecExpectation, SpecTally
from loadgen.transport.base import ErrorKind, Exchange, Transport, WireRequest
from traces import PromptSynth, Request, Session, TraceSet

DEAD_AFTER = 5  # consecutive refused connections that mean the server is gone
TIMER_RESOLUTION_S = 0.001  # event-loop timers (libuv) count milliseconds  # counted requests cut off by Ctrl-C or by a dead server


@dataclass(frozen=True, slots=True)
class Warmup:
    """Warm-up before each window: `seconds`, or `requests` per lane (open loop: in total)."""

    seconds: float = 0.0
    requests: int | None = None

    @classmethod
    def parse(cls, text: str) -> Warmup:
        """"30s", "30" (seconds) or "2req" (requests); raises ValueError naming --warmup."""
        raw = text.strip().lower()
        try:
            if raw.endswith("req"):
                value = int(raw[:-3])
                if value < 0:
                    raise ValueError
                return cls(0.0, value)
            value = float(raw[:-1] if raw.endswith("s") else raw)
            if value < 0:
                raise ValueError
            return cls(value, None)
        except ValueError:
            raise ValueError(f"--warmup: expected seconds like '30s' or requests like '2req', got {text!r}") from None

    def describe(self) -> str:
        return f"{self.requests}req" if self.requests is not None else f"{self.seconds:g}s"


@dataclass(frozen=True, slots=True)
class LevelSpec:
    mode: str  # "closed" | "poisson" | "mooncake"
    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        if self.mode == "closed":
            return f"conc {self.concurrency}"
        return f"rate {self.rate:g}/s" if self.mode == "poisson" else "mooncake"


@dataclass(frozen=True, slots=True)
class RunConfig:
    duration_s: float
    warmup: Warmup
    timing: TimingConfig
    seed: int = 0
    start_offset: tuple[float, float] = (0.25, 0.75)
    time_scale: float = 1.0
    timeout_s: float = 600.0
    max_error_rate: float = 0.10
    gpus: int = 1


@dataclass(slots=True)
class _Meta:
    """Where a request comes from, for the per-request record."""

    play_id: int
    session: str
    agent: str  # "" for the parent
    request: Request
    lane: int


@dataclass
class LevelRun:
    """Mutable state of one level while it runs."""

    spec: LevelSpec
    started_ns: int
    recorder: LevelRecorder = field(default_factory=LevelRecorder)
    window_start_ns: int | None = None
    window_end_ns: int | None = None
    stop: asyncio.Future | None = None
    ok: int = 0
    errors: Counter = field(default_factory=Counter)
    warmup_ok: int = 0
    warmup_errors: Counter = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    counted_tokens: int = 0
    usage_mismatches: int = 0
    cached_tokens: int = 0
    cached_reported: int = 0
    cached_input_tokens: int = 0  # input tokens of the requests that reported cached tokens
    session_input_tokens: Counter = field(default_factory=Counter)  # measured input per session
    inflight: int = 0
    max_inflight: int = 0
    active_trees: int = 0
    max_active_trees: int = 0
    cpu_start: float = 0.0
    sys_start: float = 0.0
    cpu_s: float | None = None
    sys_s: float | None = None
    columns: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("play", "session", "agent", "turn", "isl", "osl", "ttft_us", "e2el_us", "tpot_us", "start_ms")})
    lane_requests: Counter = field(default_factory=Counter)
    lanes_warm: int = 0
    spec_tally: SpecTally = field(default_factory=SpecTally)

    @property
    def stopping(self) -> bool:
        return self.stop.done()

    def in_window(self, t_ns: int) -> bool:
        return self.window_start_ns is not None and self.window_start_ns <= t_ns and (
            self.window_end_ns is None or t_ns < self.window_end_ns)

    def window_closed(self, t_ns: int) -> bool:
        return self.window_end_ns is not None and t_ns >= self.window_end_ns

    def open_window(self, duration_s: float) -> None:
        self.window_start_ns = time.perf_counter_ns()
        self.window_end_ns = self.window_start_ns + int(duration_s * 1e9)
        self.cpu_start = _cpu_seconds()
        self.sys_start = _sys_seconds()


class Runner:
    def __init__(
        self,
        transport: Transport,
        traces: TraceSet,
        synth: PromptSynth,
        config: RunConfig,
        theoretical_hit: Callable[[Session], float],
        on_request: Callable[[dict[str, Any]], None] | None = None,
        progress: Callable[[LevelRun, float], None] | None = None,
        spec: SpecExpectation | None = None,
    ) -> None:
        self.transport = transport
        self.traces = traces
        self.synth = synth
        self.config = config
        self.theoretical_hit = theoretical_hit
        self.on_request = on_request
        self.progress = progress
        self.spec = spec
        self.source = PlaySource(traces.sessions, config.seed, config.start_offset)
        self.status = "complete"
        self.message: str | None = None
        self.current: LevelRun | None = None
        self._consecutive_refused = 0
        self._tasks: set[asyncio.Task] = set()
        self._hit_cache: dict[str, float] = {}
        self._request_ids = itertools.count()

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

    async def run_level(self, spec: LevelSpec) -> LevelRun:
        level = LevelRun(spec, time.perf_counter_ns())
        level.stop = asyncio.get_running_loop().create_future()
        self.current = level
        lag = asyncio.create_task(monitor_loop_lag(lambda us: level.in_window(time.perf_counter_ns()) and level.recorder.record_loop_lag(us)))
        ticker = asyncio.create_task(self._tick(level)) if self.progress else None
        scrape = asyncio.create_task(self._scrape_at_window_start(level))
        try:
            if spec.mode == "closed":
                await self._closed_loop(level)
            else:
                await self._open_loop(level)
            if await scrape:  # after the drain, so the window's requests are all in the delta
                level.spec_tally.scraped.append(await self._spec_counters())
        finally:
            scrape.cancel()
            lag.cancel()
            if ticker:
                ticker.cancel()
            if level.window_start_ns is not None:
                level.cpu_s = _cpu_seconds() - level.cpu_start
                level.sys_s = _sys_seconds() - level.sys_start
                now = time.perf_counter_ns()
                if level.window_end_ns is None or level.window_end_ns > now:
                    level.window_end_ns = now
            self.current = None
        return level

    async def _scrape_at_window_start(self, level: LevelRun) -> bool:
        """Server-wide speculative counters when the window opens (the AL fallback when usage
        has none); False when the level ended before its window opened."""
        while level.window_start_ns is None and not level.stopping:
            await asyncio.wait({level.stop}, timeout=0.05)
        if level.window_start_ns is None:
            return False
        level.spec_tally.scraped.append(await self._spec_counters())
        return True

    async def _spec_counters(self) -> SpecCounters | None:
        counts = await self.transport.spec_counters()
        return None if counts is None else SpecCounters(*counts)

    # -- closed loop -------------------------------------------------------------------------

    async def _closed_loop(self, level: LevelRun) -> None:
        n = level.spec.concurrency
        lanes = [self._spawn(self._lane(level, lane)) for lane in range(n)]
        if self.config.warmup.requests in (None, 0):
            await self._sleep_until(level, level.started_ns + int(self.config.warmup.seconds * 1e9))
            if not level.stopping:
                level.open_window(self.config.duration_s)
        await self._hold_window(level)
        await self._drain(level, lanes)

    async def _hold_window(self, level: LevelRun) -> None:
        """Wait until the window has opened and closed (or the level was stopped)."""
        while level.window_end_ns is None and not level.stopping:
            await asyncio.wait({level.stop}, timeout=0.05)
        if level.window_end_ns is not None:
            await self._sleep_until(level, level.window_end_ns)
        if not level.stopping:
            level.stop.set_result(None)

    async def _drain(self, level: LevelRun, tasks: list[asyncio.Task]) -> None:
        """Requests in flight finish; each is bounded by the timeout, so this is too."""
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.config.timeout_s + 5)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)

    async def _lane(self, level: LevelRun, lane: int) -> None:
        first = True
        while not level.stopping:
            sent = level.lane_requests[lane]
            await self._play_tree(level, self.source.next_play(first), lane, warm_first=first)
            first = False
            if level.lane_requests[lane] == sent:
                await asyncio.sleep(TIMER_RESOLUTION_S)  # a play with nothing to send: never spin

    async def _play_tree(self, level: LevelRun, play: Play, lane: int, warm_first: bool) -> None:
        session, timing = play.session, self.config.timing
        level.active_trees += 1
        level.max_active_trees = max(level.max_active_trees, level.active_trees)
        subagents: dict[int, asyncio.Task] = {}
        try:
            if play.start_index == 0:
                self._launch_subagents(level, play, lane, 0, subagents, _now_s())
            prev_end = _now_s()
            for position in range(play.start_index, len(session.requests)):
                request = session.requests[position]
                if position > play.start_index:
                    ready = prev_end + request.think_time  # already scaled/capped by traces.scale_traces
                    for number, gap in plan.joins_before(session, position):
                        if number in subagents:
                            ready = max(ready, await subagents[number] + timing.scaled(gap))
                    if not await self._sleep_until(level, int(ready * 1e9)):
                        break
                if level.stopping:
                    break
                warm = warm_first and position == play.start_index
                await self._send(level, _Meta(play.play_id, session.id, "", request, lane), play.salt, warm=warm)
                prev_end = _now_s()
                self._launch_subagents(level, play, lane, position + 1, subagents, prev_end)
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

    def _launch_subagents(self, level, play: Play, lane: int, after: int, tasks: dict, anchor_s: float) -> None:
        for number in plan.subagents_after(play.session, after):
            tasks[number] = self._spawn(self._subagent(level, play, lane, number, anchor_s))

    async def _subagent(self, level: LevelRun, play: Play, lane: int, number: int, anchor_s: float) -> float:
        """Play one subagent's request chain; returns when it ended (perf_counter seconds)."""
        sub, timing = play.session.subagents[number], self.config.timing
        ready = anchor_s + plan.subagent_delay(play.session, sub, timing)
        for i, request in enumerate(sub.requests):
            if i:
                ready = _now_s() + request.think_time
            if not await self._sleep_until(level, int(ready * 1e9)):
                break
            await self._send(level, _Meta(play.play_id, play.session.id, sub.agent_id, request, lane), play.salt)
        return _now_s()

    # -- open loop ---------------------------------------------------------------------------

    async def _open_loop(self, level: LevelRun) -> None:
        cfg = self.config
        arrivals = self._arrivals(level.spec)
        warm_n = cfg.warmup.requests
        start = level.started_ns
        if warm_n is None:
            level.window_start_ns = start + int(cfg.warmup.seconds * 1e9)
            level.window_end_ns = level.window_start_ns + int(cfg.duration_s * 1e9)
        tasks: list[asyncio.Task] = []
        last_due = start
        for number, (offset, play, request) in enumerate(arrivals):
            due = start + int(offset * 1e9)
            if warm_n is not None and number == warm_n:
                level.window_start_ns = due
                level.window_end_ns = due + int(cfg.duration_s * 1e9)
            if level.window_end_ns is not None and due >= level.window_end_ns:
                break
            if not await self._sleep_until(level, due):
                break
            if level.window_start_ns is not None and level.cpu_start == 0.0 and due >= level.window_start_ns:
                level.cpu_start, level.sys_start = _cpu_seconds(), _sys_seconds()
            meta = _Meta(play.play_id, play.session.id, "", request, 0)
            tasks.append(self._spawn(self._send(level, meta, play.salt, due_ns=due)))
            last_due = due
        else:
            # The trace ran out before the window closed: the window ends at the last arrival.
            if level.window_end_ns is not None:
                level.window_end_ns = max(level.window_start_ns, min(level.window_end_ns, last_due + 1))
        if level.window_start_ns is None:
            level.window_start_ns = level.window_end_ns = last_due
        if level.cpu_start == 0.0:
            level.cpu_start, level.sys_start = _cpu_seconds(), _sys_seconds()
        if not level.stopping:
            level.stop.set_result(None)
        await self._drain(level, tasks)

    def _arrivals(self, spec: LevelSpec) -> Iterator[tuple[float, Play, Request]]:
        if spec.mode == "poisson":
            return plan.poisson_arrivals(self.source, spec.rate, self.config.seed + int(spec.rate * 1000))
        return plan.timestamp_arrivals(self.source.next_play(first_of_lane=False), self.config.time_scale)

    # -- one request -------------------------------------------------------------------------

    async def _send(self, level: LevelRun, meta: _Meta, salt: int, warm: bool = False, due_ns: int | None = None) -> None:
        origin = due_ns if due_ns is not None else time.perf_counter_ns()
        if not warm and level.window_closed(origin):
            return  # a lane woken late by a busy loop: no request starts after the window
        request = meta.request
        al = self.spec.al(request) if self.spec is not None else None
        wire = WireRequest(
            request_id=f"{meta.play_id}-{meta.agent or 'main'}-{request.index}-{next(self._request_ids)}",
            prompt=self.synth.prompt(meta.session, request, salt),
            max_tokens=request.output_tokens,
            user=f"agentload-{meta.play_id}",
            acceptance_length=al if self.spec is not None and self.spec.send else None,
        )
        counted = not warm and level.in_window(origin)
        level.inflight += 1
        level.max_inflight = max(level.max_inflight, level.inflight)
        try:
            exchange = await self.transport.send(wire)
        except asyncio.CancelledError:
            if counted:
                level.errors[ErrorKind.CANCELLED] += 1
            if self.on_request is not None:  # the per-request file keeps every counted error
                cancelled = Exchange(start_ns=origin, end_ns=time.perf_counter_ns(), error=ErrorKind.CANCELLED,
                                     error_detail="cancelled when the level stopped")
                self.on_request(_request_record(level, meta, wire.request_id, cancelled, origin, counted, al))
            raise
        finally:
            level.inflight -= 1
        if due_ns is None and exchange.start_ns:
            # Closed loop: latency starts when the request reached the wire, so the client's own
            # prompt synthesis and body encoding never count as server time.
            origin = exchange.start_ns
        self._account(level, meta, wire.request_id, exchange, origin, counted, due_ns is not None, al)

    def _account(self, level: LevelRun, meta: _Meta, wire_id: str, ex: Exchange, origin: int, counted: bool,
                 open_loop: bool, al: float | None) -> None:
        level.lane_requests[meta.lane] += 1
        self._watch_server(ex)
        if ex.error:
            (level.errors if counted else level.warmup_errors)[ex.error] += 1
        elif not counted:
            level.warmup_ok += 1
        else:
            self._measure(level, meta, ex, origin, open_loop)
            usage = None if ex.spec_num_drafts is None else SpecCounters(ex.spec_num_drafts, ex.spec_num_accepted_tokens or 0)
            level.spec_tally.add(al, ex.output_tokens, usage)
        self._maybe_open_window_after_warmup_requests(level, meta.lane)
        if self.on_request is not None:
            self.on_request(_request_record(level, meta, wire_id, ex, origin, counted, al))

    def _measure(self, level: LevelRun, meta: _Meta, ex: Exchange, origin: int, open_loop: bool) -> None:
        request = meta.request
        osl = ex.output_tokens
        ttft_us = (ex.chunk_ns[0] - origin) // 1000
        e2el_us = (ex.chunk_ns[-1] - origin) // 1000
        rec = level.recorder
        tpot_us = rec.record_latencies(ttft_us, e2el_us, osl, ex.chunk_ns, ex.chunk_tokens)
        if open_loop:
            rec.record_queue_delay((ex.start_ns - origin) // 1000)
        level.ok += 1
        level.input_tokens += request.input_tokens
        level.output_tokens += osl
        level.counted_tokens += ex.counted_tokens
        if ex.usage_completion_tokens is not None and ex.usage_completion_tokens != ex.counted_tokens:
            level.usage_mismatches += 1
        if ex.cached_tokens is not None:
            level.cached_tokens += ex.cached_tokens
            level.cached_input_tokens += request.input_tokens
            level.cached_reported += 1
        level.session_input_tokens[meta.session] += request.input_tokens
        cols = level.columns
        cols["play"].append(meta.play_id)
        cols["session"].append(meta.session)
        cols["agent"].append(meta.agent)
        cols["turn"].append(request.index)
        cols["isl"].append(request.input_tokens)
        cols["osl"].append(osl)
        cols["ttft_us"].append(ttft_us)
        cols["e2el_us"].append(e2el_us)
        cols["tpot_us"].append(tpot_us)
        cols["start_ms"].append(round((origin - level.window_start_ns) / 1e6, 3))

    def theoretical_hit_rate(self, level: LevelRun) -> float | None:
        """The trace's infinite-cache hit rate over the measured requests' sessions, weighted by
        their measured input tokens. Computed after the window: it is slow on long sessions."""
        if not level.input_tokens:
            return None
        weighted = 0.0
        for session_id, tokens in level.session_input_tokens.items():
            if session_id not in self._hit_cache:
                session = next(s for s in self.traces.sessions if s.id == session_id)
                self._hit_cache[session_id] = self.theoretical_hit(session)
            weighted += tokens * self._hit_cache[session_id]
        return round(weighted / level.input_tokens, 6)

    def _maybe_open_window_after_warmup_requests(self, level: LevelRun, lane: int) -> None:
        wanted = self.config.warmup.requests
        if level.spec.mode != "closed" or not wanted or level.window_start_ns is not None:
            return
        if level.lane_requests[lane] == wanted:
            level.lanes_warm += 1
            if level.lanes_warm == level.spec.concurrency:
                level.open_window(self.config.duration_s)

    def _watch_server(self, ex: Exchange) -> None:
        if ex.error != ErrorKind.CONNECT:
            if ex.error is None:
                self._consecutive_refused = 0
            return
        self._consecutive_refused += 1
        if self._consecutive_refused >= DEAD_AFTER and not self.stopped:
            self.interrupt("server_dead", f"the server refused {DEAD_AFTER} connections in a row "
                           f"({ex.error_detail}); stopping with the results measured so far")

    # -- helpers -----------------------------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _sleep_until(self, level: LevelRun, deadline_ns: int) -> bool:
        """Sleep until `deadline_ns` (perf_counter), never waking before it (the loop's timers
        have millisecond resolution and may fire early); False when the level stopped meanwhile."""
        while not level.stopping:
            delay = (deadline_ns - time.perf_counter_ns()) / 1e9
            if delay <= 0:
                break
            await asyncio.wait({level.stop}, timeout=max(delay, TIMER_RESOLUTION_S))
        return not level.stopping

    async def _tick(self, level: LevelRun) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.progress(level, self.config.duration_s)


def level_summary(level: LevelRun, config: RunConfig, theoretical_hit_rate: float | None,
                  spec: SpecExpectation | None = None) -> dict[str, Any]:
    """The results-file entry of one level (see results.py)."""
    window_s = 0.0
    if level.window_start_ns is not None and level.window_end_ns is not None:
        window_s = max(0.0, (level.window_end_ns - level.window_start_ns) / 1e9)
    errors_total = sum(level.errors.values())
    attempted = level.ok + errors_total
    error_rate = errors_total / attempted if attempted else 0.0
    reasons = []
    if error_rate > config.max_error_rate:
        reasons.append(f"error rate {error_rate:.1%} > --max-error-rate {config.max_error_rate:.1%}")
    if level.ok == 0:
        reasons.append("no request completed inside the window")
    per_s = (lambda x: round(x / window_s, 3)) if window_s > 0 else (lambda x: 0.0)
    gpus = max(1, config.gpus)
    metrics = level.recorder.summary()
    lag_p99 = metrics["loop_lag"]["stats"]["p99"]
    cpu_util = level.cpu_s / window_s if level.cpu_s is not None and window_s > 0 else None
    warnings = []
    if lag_p99 is not None and lag_p99 > WARN_P99_US:
        warnings.append(f"client event loop lagged (p99 {lag_p99 / 1000:.1f} ms): the client may be the bottleneck")
    if cpu_util is not None and cpu_util > 0.9:
        warnings.append(f"client used {cpu_util:.0%} of a core during the window: it may be the bottleneck")
    return {
        "mode": level.spec.mode,
        "concurrency": level.spec.concurrency,
        "rate": level.spec.rate,
        "label": level.spec.label,
        "failed": bool(reasons),
        "fail_reasons": reasons,
        "window_s": round(window_s, 6),
        "counts": {
            "requests_ok": level.ok,
            "errors": dict(level.errors),
            "errors_total": errors_total,
            "error_rate": round(error_rate, 6),
            "warmup_requests_ok": level.warmup_ok,
            "warmup_errors": dict(level.warmup_errors),
            "input_tokens": level.input_tokens,
            "output_tokens": level.output_tokens,
            "output_tokens_counted": level.counted_tokens,
            "usage_mismatch_requests": level.usage_mismatches,
            "max_inflight_requests": level.max_inflight,
            "max_active_trees": level.max_active_trees,
        },
        "throughput": {
            "requests_per_s": per_s(level.ok),
            "input_tokens_per_s": per_s(level.input_tokens),
            "output_tokens_per_s": per_s(level.output_tokens),
            "total_tokens_per_s": per_s(level.input_tokens + level.output_tokens),
            "gpus": gpus,
            "input_tokens_per_s_per_gpu": per_s(level.input_tokens / gpus),
            "output_tokens_per_s_per_gpu": per_s(level.output_tokens / gpus),
            "total_tokens_per_s_per_gpu": per_s((level.input_tokens + level.output_tokens) / gpus),
        },
        "cache": {
            "cached_tokens": level.cached_tokens if level.cached_reported else None,
            "requests_reporting_cached": level.cached_reported,
            # over the requests that report cached tokens: the others say nothing either way
            "measured_hit_rate": round(level.cached_tokens / level.cached_input_tokens, 6)
            if level.cached_reported and level.cached_input_tokens else None,
            "trace_theoretical_hit_rate": theoretical_hit_rate,
        },
        "client": {"cpu_s": round(level.cpu_s, 4) if level.cpu_s is not None else None,
                   "cpu_sys_s": round(level.sys_s, 4) if level.sys_s is not None else None,
                   "cpu_util": round(cpu_util, 4) if cpu_util is not None else None,
                   "warnings": warnings},
        "spec_decode": level.spec_tally.summary(spec),
        "metrics": metrics,
        "requests": level.columns,
    }


def _request_record(level: LevelRun, meta: _Meta, wire_id: str, ex: Exchange, origin: int, counted: bool,
                    al: float | None) -> dict[str, Any]:
    """One --per-request line. Times are perf_counter_ns (CLOCK_MONOTONIC on Linux, so they
    compare with other processes' timestamps on the same host); due_ns is the intended start."""
    return {
        "level": level.spec.label, "id": wire_id, "play": meta.play_id, "session": meta.session,
        "agent": meta.agent, "turn": meta.request.index, "isl": meta.request.input_tokens,
        "osl_asked": meta.request.output_tokens, "osl": ex.output_tokens, "osl_counted": ex.counted_tokens,
        "cached_tokens": ex.cached_tokens, "due_ns": origin, "start_ns": ex.start_ns,
        "first_ns": ex.chunk_ns[0] if ex.chunk_ns else None,
        "last_ns": ex.chunk_ns[-1] if ex.chunk_ns else None, "end_ns": ex.end_ns,
        "chunk_ns": ex.chunk_ns, "chunk_tokens": ex.chunk_tokens, "thinking": meta.request.thinking,
        "expected_al": al, "spec_num_drafts": ex.spec_num_drafts, "spec_num_accepted_tokens": ex.spec_num_accepted_tokens,
        "counted": counted and ex.error is None, "error": ex.error, "error_detail": ex.error_detail,
    }


def dumps_record(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


def _now_s() -> float:
    return time.perf_counter_ns() / 1e9


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sys_seconds() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime
