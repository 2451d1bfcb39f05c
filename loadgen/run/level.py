"""One level of a sweep: what it is (`LevelLoad`), how it runs (`RunConfig`, `Warmup`), and
its state while it runs (`LevelRun`).

A level run by several worker processes (loadgen/run/workers.py) is one `LevelRun` per worker;
`LevelRun.export` turns one into picklable data (histograms in HDR's encoded form) and
`LevelRun.absorb` adds such data into another, exactly: counts add, histograms merge bucket by
bucket, per-request columns concatenate.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loadgen.defaults import DEFAULTS
from loadgen.results.attainment import LiveSums, SloTally
from loadgen.results.metrics import LevelRecorder, decode_histogram
from loadgen.results.slo import DEFAULT_TARGET, Slo
from loadgen.run.plan import TimingConfig
from loadgen.run.spec_decode import SpecTally
from loadgen.telemetry.server_counters import ServerCounters
from traces import Request

COLUMNS = ("play", "session", "agent", "turn", "isl", "osl", "ttft_us", "e2el_us", "tpot_us", "start_ms")


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
            seconds = float(raw[:-1] if raw.endswith("s") else raw)
            if seconds < 0:
                raise ValueError
            return cls(seconds, None)
        except ValueError:
            raise ValueError(f"--warmup: expected seconds like '30s' or requests like '2req', got {text!r}") from None

    def describe(self) -> str:
        return f"{self.requests}req" if self.requests is not None else f"{self.seconds:g}s"

    @property
    def primes(self) -> bool:
        """Whether anything is sent before the window: then a closed loop's lanes re-send their start
        requests there, and their contexts are in the server's cache when it opens."""
        return bool(self.requests) or self.seconds > 0


@dataclass(frozen=True, slots=True)
class LevelLoad:
    mode: str  # "closed" | "poisson" | "mooncake"
    concurrency: int | None = None
    rate: float | None = None
    # mooncake: the recorded timestamps multiplied by this (None: the run's --time-scale)
    time_scale: float | None = None
    # its window when not the run's --duration (a capacity search's confirming probe: loadgen/capacity/search.py)
    window_s: float | None = None

    @property
    def lanes(self) -> int:
        """Closed loop: the concurrency; 0 for the open loop, which has no lanes."""
        return self.concurrency or 0

    @property
    def label(self) -> str:
        if self.mode == "closed":
            return f"conc {self.concurrency}"
        if self.mode == "poisson":
            return f"rate {self.rate:g}/s"
        return "mooncake" if self.time_scale is None else f"mooncake x{1 / self.time_scale:.4g}"


@dataclass(frozen=True, slots=True)
class RunConfig:
    duration_s: float
    warmup: Warmup
    timing: TimingConfig
    seed: int = DEFAULTS.seed
    start_offset: tuple[float, float] = DEFAULTS.start_offset
    time_scale: float = DEFAULTS.time_scale
    timeout_s: float = DEFAULTS.timeout_s
    max_error_rate: float = DEFAULTS.max_error_rate
    gpus: int = 1
    warmup_timeout_s: float = DEFAULTS.warmup_timeout_s
    slos: tuple[Slo, ...] = ()  # every level reports its attainment of each (loadgen/results/slo.py)
    slo_target: float = DEFAULT_TARGET  # the share of good requests that holds an SLO
    # the SLO a level tallies while it runs (the capacity search's early stop); None: no tally
    live_slo: Slo | None = None

    def window_of(self, load: LevelLoad) -> float:
        """The measurement window of a level: its own, else the run's."""
        return self.duration_s if load.window_s is None else load.window_s


@dataclass(frozen=True, slots=True)
class Share:
    """The part of a level one worker plays: lanes `index`, `index + count`, ... (closed loop),
    or arrivals number `index`, `index + count`, ... (open loop). The whole level is Share(0, 1)."""

    index: int = 0
    count: int = 1

    def lanes(self, concurrency: int) -> range:
        return range(self.index, concurrency, self.count)

    def owns_arrival(self, number: int) -> bool:
        return number % self.count == self.index


class RequestMeta:
    """Where a request comes from, for the per-request record."""

    __slots__ = ("play_id", "session", "agent", "request", "lane")

    def __init__(self, play_id: int, session: str, agent: str, request: Request, lane: int) -> None:
        self.play_id = play_id
        self.session = session
        self.agent = agent  # "" for the parent
        self.request = request
        self.lane = lane


_COUNTERS = ("ok", "warmup_ok", "input_tokens", "output_tokens", "counted_tokens", "usage_mismatches",
             "cached_tokens", "cached_reported", "cached_input_tokens")
_TALLIES = ("errors", "warmup_errors", "session_input_tokens")
_LISTS = ("error_plays",)


@dataclass
class LevelRun:
    """Mutable state of one level (or of one worker's share of it) while it runs."""

    load: LevelLoad
    started_ns: int
    recorder: LevelRecorder = field(default_factory=LevelRecorder)
    window_start_ns: int | None = None
    window_end_ns: int | None = None
    window_start_unix: float | None = None  # the window's start on the wall clock (to align other tools' logs)
    # set when the level stops (window closed, interrupted); made inside the running loop
    stop: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # set by `open_window`
    window_opened: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
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
    error_plays: list[int] = field(default_factory=list)  # the play of each counted failed request
    slo_tally: SloTally | None = None  # RunConfig.live_slo's running tally
    inflight_since: dict[int, int] = field(default_factory=dict)  # request number -> start, oldest first
    inflight_ns: int = 0  # time requests were in flight inside the window, summed over requests
    max_inflight: int = 0
    active_trees: int = 0
    max_active_trees: int = 0
    cpu_start: float = 0.0
    sys_start: float = 0.0
    cpu_s: float | None = None
    sys_s: float | None = None
    switches_start: int = 0
    preempted: int | None = None  # involuntary context switches of the window (other tasks took the core)
    columns: dict[str, list] = field(default_factory=lambda: {k: [] for k in COLUMNS})
    lane_requests: Counter = field(default_factory=Counter)
    lanes_warm: int = 0
    # coordinated runs: this share's lanes are all warm
    lanes_ready: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    warmup_prompt_tokens: int = 0  # planned: the resent contexts and warm-up requests' inputs
    spec_tally: SpecTally = field(default_factory=SpecTally)
    kernel_compiles: list[int | None] = field(default_factory=list)  # the server's, at window start, after the drain
    workers: int = 1

    @property
    def stopping(self) -> bool:
        return self.stop.done()

    @property
    def window_s(self) -> float:
        if self.window_start_ns is None or self.window_end_ns is None:
            return 0.0
        return max(0.0, (self.window_end_ns - self.window_start_ns) / 1e9)

    def in_window(self, t_ns: int) -> bool:
        return self.window_start_ns is not None and self.window_start_ns <= t_ns and (
            self.window_end_ns is None or t_ns < self.window_end_ns)

    @property
    def inflight(self) -> int:
        return len(self.inflight_since)

    def count_error(self, kind: str, play: int, counted: bool) -> None:
        """A failed request: counted ones by kind and against their play (never good under an SLO)."""
        if not counted:
            self.warmup_errors[kind] += 1
            return
        self.errors[kind] += 1
        self.error_plays.append(play)
        if self.slo_tally is not None:
            self.slo_tally.add_error(play)

    def slo_sums(self) -> LiveSums:
        """The live SLO's tally so far (empty without one)."""
        return LiveSums() if self.slo_tally is None else self.slo_tally.sums()

    def record_scrape(self, counters: ServerCounters | None) -> None:
        """One scrape of the server's counters (at window start, after the drain)."""
        self.spec_tally.scraped.append(None if counters is None else counters.spec)
        self.kernel_compiles.append(None if counters is None else counters.kernel_compiles)

    @property
    def window_kernel_compiles(self) -> int | None:
        """Kernels the server compiled from window start to after the drain, where it says."""
        start, end = self.kernel_compiles if len(self.kernel_compiles) == 2 else (None, None)
        return None if start is None or end is None else end - start

    def request_started(self, number: int, start_ns: int) -> None:
        self.inflight_since[number] = start_ns
        self.max_inflight = max(self.max_inflight, len(self.inflight_since))

    def request_ended(self, number: int, end_ns: int) -> None:
        """The request is no longer in flight; its time inside the window adds to inflight_ns."""
        self.inflight_ns += self._window_overlap(self.inflight_since.pop(number), end_ns)

    def _window_overlap(self, start_ns: int, end_ns: int) -> int:
        if self.window_start_ns is None:
            return 0
        stop = end_ns if self.window_end_ns is None else min(end_ns, self.window_end_ns)
        return max(0, stop - max(start_ns, self.window_start_ns))

    def window_closed(self, t_ns: int) -> bool:
        return self.window_end_ns is not None and t_ns >= self.window_end_ns

    def open_window(self, duration_s: float, start_ns: int | None = None) -> None:
        self.window_start_ns = time.perf_counter_ns() if start_ns is None else start_ns
        self.window_end_ns = self.window_start_ns + int(duration_s * 1e9)
        self.window_start_unix = wall_clock_at(self.window_start_ns)
        self.cpu_start = cpu_seconds()
        self.sys_start = sys_seconds()
        self.switches_start = involuntary_switches()
        if not self.window_opened.done():
            self.window_opened.set_result(None)

    async def window_opened_or_stopped(self) -> None:
        """Until `open_window` or the level's stop, whichever comes first."""
        await asyncio.wait({self.window_opened, self.stop}, return_when=asyncio.FIRST_COMPLETED)

    def close_window(self) -> None:
        """After the drain (or a stop): the client CPU of the window, and a window cut short ends now."""
        if self.window_start_ns is None:
            return
        self.cpu_s = cpu_seconds() - self.cpu_start
        self.sys_s = sys_seconds() - self.sys_start
        self.preempted = involuntary_switches() - self.switches_start
        now = time.perf_counter_ns()
        if self.window_end_ns is None or self.window_end_ns > now:
            self.window_end_ns = now
        # requests still running (cancelled by a stop) count up to here, and nothing after
        for number, start in self.inflight_since.items():
            self.inflight_ns += self._window_overlap(start, now)
            self.inflight_since[number] = now

    # -- merging the shares of several workers ---------------------------------------------

    def export(self) -> dict[str, Any]:
        """Picklable data of what this share measured (for `absorb` in the parent)."""
        hists = self.recorder.encoded()
        return {
            **{name: getattr(self, name) for name in _COUNTERS},
            **{name: dict(getattr(self, name)) for name in _TALLIES},
            **{name: list(getattr(self, name)) for name in _LISTS},
            "max_inflight": self.max_inflight, "max_active_trees": self.max_active_trees,
            "inflight_ns": self.inflight_ns, "kernel_compiles": self.kernel_compiles,
            "window_s": self.window_s if self.window_start_ns is not None else None,
            "window_start_unix": self.window_start_unix,
            "cpu_s": self.cpu_s, "sys_s": self.sys_s, "preempted": self.preempted, "columns": self.columns,
            "hdr": hists, "spec": self.spec_tally,
        }

    def absorb(self, part: dict[str, Any]) -> None:
        """Add one worker's exported share. The merged window is the longest of the shares'
        (they open and close together; a share cut short by a stop ends early); CPU adds up."""
        for name in _COUNTERS:
            setattr(self, name, getattr(self, name) + part[name])
        for name in _TALLIES:
            getattr(self, name).update(part[name])
        for name in _LISTS:
            getattr(self, name).extend(part[name])
        self.max_inflight += part["max_inflight"]  # shares peak at about the same time: an upper bound
        self.max_active_trees += part["max_active_trees"]
        self.inflight_ns += part["inflight_ns"]
        if part["kernel_compiles"]:  # one share scrapes the server for all
            self.kernel_compiles = list(part["kernel_compiles"])
        if part["window_s"] is not None:
            start = self.window_start_ns if self.window_start_ns is not None else 0
            self.window_start_ns = start
            self.window_end_ns = max(self.window_end_ns or start, start + int(part["window_s"] * 1e9))
        if part["window_start_unix"] is not None:
            self.window_start_unix = min(filter(None, (self.window_start_unix, part["window_start_unix"])))
        if part["cpu_s"] is not None:
            self.cpu_s = (self.cpu_s or 0.0) + part["cpu_s"]
            self.sys_s = (self.sys_s or 0.0) + part["sys_s"]
            self.preempted = (self.preempted or 0) + part["preempted"]
        for name in COLUMNS:
            self.columns[name].extend(part["columns"][name])
        for name, text in part["hdr"].items():
            self.recorder.hists[name].add(decode_histogram(text))
        self.spec_tally.merge(part["spec"])


def wall_clock_at(perf_ns: int) -> float:
    """The wall-clock time (Unix seconds) of a `time.perf_counter_ns()` reading. The clocks are
    paired by reading the wall clock between two perf readings, the tightest of three tries, so a
    preemption between the reads does not shift the result."""
    brackets = []
    for _ in range(3):
        before = time.perf_counter_ns()
        wall = time.time()
        brackets.append((time.perf_counter_ns() - before, wall, before))
    gap, wall, before = min(brackets)
    return wall - (before + gap / 2 - perf_ns) / 1e9


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sys_seconds() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def involuntary_switches() -> int:
    """Times this process was taken off a core while it could run: another task wanted the core."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
