"""Client worker processes: a level's lanes (closed loop) or arrivals (open loop) split across
processes, each with its own event loop and connection pool, merged into one level exactly.

A pool runs levels and reports progress through one interface, whatever it is made of:

- `LocalPool`: the whole level in this process (one worker, the default for small loads);
- `ProcessPool`: N processes on this host, driven over pipes;
- `RayPool` (loadgen/run/ray_pool.py): N Ray actors across a Ray cluster's nodes.

Each worker runs a `Runner` over its `Share` of the level (runner.py) and returns its share
exported as plain data (LevelRun.export); the parent adds the shares into one LevelRun, so the
results file is the one a single process would write. The plan depends only on the seed
(plan.LanePlays, open_loop.arrivals), never on the number of workers. Workers meet at a common
start given as wall-clock time (hosts of a Ray cluster share no monotonic clock); a warm-up that
counts requests ends when every worker's lanes are warm, which the parent sees in the workers'
progress snapshots and announces to all of them (`open_window`).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import math
import multiprocessing
import multiprocessing.process
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.run import progress
from loadgen.run.level import LevelLoad, LevelRun, RunConfig, Share
from loadgen.run.runner import Runner
from loadgen.run.spec_decode import SpecExpectation
from loadgen.run.summary import dumps_record
from loadgen.run.trace_cache import PackedTraces
from traces import PromptSynth

# Output tokens/s one client process streams on one core before its loop lags
# (`benchmarks/client_overhead.py --scaling CONC` compares one worker with two at a load).
TOKENS_PER_S_PER_CORE = 25_000
STREAM_TOKENS_PER_S = 100  # a busy stream of a fast server (10 ms between tokens): the closed loop's estimate
START_AHEAD_S = 0.05  # workers start a level together this long after the parent asks


def auto_workers(levels: list[LevelLoad], mean_output_tokens: float, cpus: int | None = None) -> int:
    """Enough worker processes for the heaviest level at TOKENS_PER_S_PER_CORE, at most the CPUs."""
    demand = 0.0
    for load in levels:
        if load.mode == "closed":
            demand = max(demand, load.lanes * STREAM_TOKENS_PER_S)
        elif load.mode == "poisson":
            demand = max(demand, (load.rate or 0.0) * mean_output_tokens)
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(cpus, math.ceil(demand / TOKENS_PER_S_PER_CORE)))


@dataclass(frozen=True)
class HttpTarget:
    """What a worker needs to build its own HTTP transport."""

    url: str
    endpoint: str
    model: str | None
    api_key: str | None
    headers: dict[str, str]
    timeout_s: float


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs, picklable: it travels to a new process or a Ray node."""

    target: HttpTarget
    traces: PackedTraces  # packed once for all workers (trace_cache.PackedTraces)
    vocab: tuple[int, int]  # offset, size
    config: RunConfig
    spec: dict[str, Any] | None  # SpecExpectation.describe(), rebuilt in the worker
    share: Share
    max_connections: int
    per_request: bool


class WorkerError(Exception):
    """A worker process or actor failed or went away."""


CLOCK_PAIR_TRIES = 5


def mono_from_wall(wall_ns: int) -> int:
    """A wall-clock instant on this host's perf_counter_ns timeline.

    The two clocks are read as wall, perf, wall, and the pair with the tightest wall reads of a few
    tries is used: a preemption between single reads (milliseconds on a loaded host) would shift
    this worker's whole plan against the other workers' by that much."""
    best_spread, best_offset = None, 0
    for _ in range(CLOCK_PAIR_TRIES):
        before, perf, after = time.time_ns(), time.perf_counter_ns(), time.time_ns()
        if best_spread is None or after - before < best_spread:
            best_spread, best_offset = after - before, perf - (before + after) // 2
    return wall_ns + best_offset


class Worker:
    """One share of every level, in the process (or Ray actor) it lives in."""

    def __init__(self, setup: WorkerSetup) -> None:
        from loadgen.transport.http import HttpTransport

        t = setup.target
        self.setup = setup
        self.transport = HttpTransport(t.url, t.endpoint, t.model, t.api_key, t.headers, t.timeout_s)
        self.records: list[bytes] = []
        traces = setup.traces.unpack(freeze=True)  # the worker's process lives for the run
        synth = PromptSynth(traces.block_size, vocab_size=setup.vocab[1], vocab_offset=setup.vocab[0])
        spec = _expectation(setup.spec)
        on_request = (lambda rec: self.records.append(dumps_record(rec))) if setup.per_request else None
        self.runner = Runner(self.transport, traces, synth, setup.config, on_request=on_request, spec=spec,
                             share=setup.share, coordinated=True)

    async def open(self) -> None:
        await self.transport.open(self.setup.max_connections)
        gc.collect()
        gc.freeze()  # the traces are many long-lived objects: the cyclic GC need not walk them

    async def run_level(self, load: LevelLoad, index: int, start_wall_ns: int) -> dict[str, Any]:
        level = await self.runner.run_level(load, index, mono_from_wall(start_wall_ns))
        records, self.records = b"".join(self.records), []
        return {"part": level.export(), "status": self.runner.status, "message": self.runner.message,
                "records": records}

    def snapshot(self) -> dict[str, Any]:
        snap = progress.snapshot(self.runner.current)
        snap["status"], snap["message"] = self.runner.status, self.runner.message
        return snap

    async def wait_warm(self) -> None:
        await self.runner.wait_warm()

    def open_window(self, wall_ns: int) -> None:
        self.runner.open_window(mono_from_wall(wall_ns))

    def end_window(self) -> None:
        self.runner.end_window()

    def interrupt(self, status: str, message: str | None) -> None:
        self.runner.interrupt(status, message)

    async def close(self) -> None:
        await self.transport.close()


def _expectation(described: dict[str, Any] | None) -> SpecExpectation | None:
    if described is None:
        return None
    return SpecExpectation(described["k"], described["sent_per_request"], described["al_thinking_on"],
                           described["al_thinking_off"], described["golden_al"], described["thinking"])


class Pool:
    """Runs levels over its workers; subclasses say how a call reaches a worker."""

    workers = 1

    def __init__(self) -> None:
        self.status = "complete"
        self.message: str | None = None

    @property
    def stopped(self) -> bool:
        return self.status != "complete"

    async def start(self) -> None:
        """Start the workers (processes, actors) and open their connections."""

    async def run_level(self, load: LevelLoad, index: int) -> LevelRun:
        raise NotImplementedError

    async def snapshot(self) -> dict[str, Any]:
        """All workers' progress as one (progress.combine); stops every worker when one stopped."""
        raise NotImplementedError

    async def open_window_when_warm(self) -> None:
        """Once every share's lanes are warm (a warm-up counting requests), open the window
        everywhere at that moment."""

    def interrupt(self, status: str = "interrupted", message: str | None = None) -> None:
        raise NotImplementedError

    async def end_window(self) -> None:
        """End the running level's window now, in every share (runner.end_window)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the connections and end the workers."""


class LocalPool(Pool):
    """The whole level in this process: the runner is called directly."""

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self.runner = runner

    async def run_level(self, load: LevelLoad, index: int) -> LevelRun:
        level = await self.runner.run_level(load, index)
        self.status, self.message = self.runner.status, self.runner.message
        return level

    async def snapshot(self) -> dict[str, Any]:
        return progress.combine([progress.snapshot(self.runner.current)])

    def interrupt(self, status: str = "interrupted", message: str | None = None) -> None:
        self.runner.interrupt(status, message)
        self.status, self.message = self.runner.status, self.runner.message

    async def end_window(self) -> None:
        self.runner.end_window()


class RemotePool(Pool):
    """Workers reached through `_call(worker, method, *args)` (a pipe or Ray); shares merged here."""

    def __init__(self, workers: int, on_records: Callable[[bytes], None] | None) -> None:
        super().__init__()
        self.workers = workers
        self.on_records = on_records

    async def _call(self, worker: int, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def _notify(self, worker: int, method: str, *args: Any) -> None:
        """A call whose answer nobody waits for (signal handlers cannot await)."""
        asyncio.get_running_loop().create_task(self._call(worker, method, *args))

    async def _all(self, method: str, *args: Any) -> list[Any]:
        return await asyncio.gather(*(self._call(w, method, *args) for w in range(self.workers)))

    async def run_level(self, load: LevelLoad, index: int) -> LevelRun:
        start_wall = time.time_ns() + int(START_AHEAD_S * 1e9)
        results = await self._all("run_level", load, index, start_wall)
        merged = LevelRun(load, 0)
        merged.workers = self.workers
        for result in results:
            merged.absorb(result["part"])
            if result["records"] and self.on_records is not None:
                self.on_records(result["records"])
            if result["status"] != "complete" and not self.stopped:
                self.status, self.message = result["status"], result["message"]
        return merged

    async def snapshot(self) -> dict[str, Any]:
        parts = await self._all("snapshot")
        for part in parts:
            if part["status"] != "complete" and not self.stopped:
                self.interrupt(part["status"], part["message"])
        return progress.combine(parts)

    async def open_window_when_warm(self) -> None:
        await self._all("wait_warm")
        await self._all("open_window", time.time_ns())

    async def end_window(self) -> None:
        await self._all("end_window")

    def interrupt(self, status: str = "interrupted", message: str | None = None) -> None:
        if not self.stopped:
            self.status, self.message = status, message
        for worker in range(self.workers):
            self._notify(worker, "interrupt", status, message)


class ProcessPool(RemotePool):
    """N worker processes on this host (spawned: a fresh interpreter, no inherited loop state)."""

    def __init__(self, setups: list[WorkerSetup], on_records: Callable[[bytes], None] | None) -> None:
        super().__init__(len(setups), on_records)
        self._setups = setups
        self._channels: list[_Channel] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []

    async def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        for setup in self._setups:
            parent, child = context.Pipe()
            proc = context.Process(target=worker_process_main, args=(child,),
                                   name=f"agentload-worker-{setup.share.index}", daemon=True)
            proc.start()
            child.close()
            self._procs.append(proc)
            self._channels.append(_Channel(parent, proc))
        await asyncio.gather(*(ch.call("setup", setup) for ch, setup in zip(self._channels, self._setups)))
        await self._all("open")

    async def _call(self, worker: int, method: str, *args: Any) -> Any:
        return await self._channels[worker].call(method, *args)

    async def close(self) -> None:
        for channel in self._channels:
            if channel.alive:
                try:
                    await asyncio.wait_for(channel.call("close"), 10)
                except (WorkerError, asyncio.TimeoutError):
                    pass
            channel.shut()
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


class _Channel:
    """The parent's end of one worker's pipe: numbered calls, answers matched to them."""

    def __init__(self, conn, proc: multiprocessing.process.BaseProcess) -> None:
        self.conn = conn
        self.proc = proc
        self.alive = True
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._loop = asyncio.get_running_loop()
        _watch(self._loop, conn, self._readable)

    async def call(self, method: str, *args: Any) -> Any:
        if not self.alive:
            raise WorkerError(f"worker process {self.proc.pid} has exited (code {self.proc.exitcode})")
        number, self._next = self._next, self._next + 1
        future = self._loop.create_future()
        self._waiting[number] = future
        self.conn.send((number, method, args))
        return await future

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                number, ok, value = self.conn.recv()
                future = self._waiting.pop(number)
                if not future.done():
                    future.set_result(value) if ok else future.set_exception(WorkerError(value))
        except (EOFError, OSError):
            self.shut()

    def shut(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self._loop.remove_reader(self.conn.fileno())
        self.conn.close()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(WorkerError(f"worker process {self.proc.pid} exited"))
        self._waiting.clear()


def _watch(loop: asyncio.AbstractEventLoop, conn, callback: Callable[[], None]) -> None:
    """Call `callback` when `conn` has data. The loop makes the descriptor non-blocking; the
    Connection's recv and send expect a blocking one (whole messages), so it is set back: the
    callback reads only when a message has begun to arrive, and the sender writes it whole."""
    loop.add_reader(conn.fileno(), callback)
    os.set_blocking(conn.fileno(), True)


def worker_process_main(conn) -> None:
    """Entry point of a worker process: serve the parent's calls until the pipe closes."""
    # Ctrl-C reaches the whole process group: the parent alone decides, and tells the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from loadgen.run.event_loop import run_event_loop

    run_event_loop(_serve(conn))


async def _serve(conn) -> None:
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    state: dict[str, Worker] = {}

    def answer(number: int, ok: bool, value: Any) -> None:
        try:
            conn.send((number, ok, value))
        except (BrokenPipeError, OSError):
            pass

    def finished(number: int, task: asyncio.Task) -> None:
        if task.cancelled():
            answer(number, False, "cancelled")
        elif task.exception() is not None:
            exc = task.exception()
            answer(number, False, f"{type(exc).__name__}: {exc}")
        else:
            answer(number, True, task.result())

    def readable() -> None:
        try:
            while conn.poll():
                number, method, args = conn.recv()
                try:
                    if method == "setup":
                        state["worker"] = Worker(*args)
                        answer(number, True, None)
                        continue
                    result = getattr(state["worker"], method)(*args)
                except Exception as exc:  # reported to the parent, which fails the run with it
                    answer(number, False, f"{type(exc).__name__}: {exc}")
                    continue
                if asyncio.iscoroutine(result):
                    task = loop.create_task(result)
                    task.add_done_callback(functools.partial(finished, number))
                else:
                    answer(number, True, result)
        except (EOFError, OSError):
            if not closed.done():
                closed.set_result(None)

    _watch(loop, conn, readable)
    await closed
    loop.remove_reader(conn.fileno())
    worker = state.get("worker")
    if worker is not None:
        worker.runner.interrupt()
        await worker.close()
