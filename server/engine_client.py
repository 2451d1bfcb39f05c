"""The engine core in its own process, and the API process's handle on it.

The child process ('spawn' context, so no state leaks from the parent) builds `Engine(config)`
and loops: drain every queued `AddRequest` / `AbortRequest`, run one step while work exists,
send that step's `StepOutputs` back in one message. It never shares a GIL with HTTP work.

The API side sends through a writer thread (a large prompt must not block the event loop while
the child is busy stepping) and reads on the event loop with `loop.add_reader` on the output
pipe, fanning outputs out to one `RequestStream` per request. When the child dies, every open
stream fails with the reason and `on_death` is called once.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

from server.config import EngineConfig, resolve_device
from server.engine.messages import AbortRequest, AddRequest, EngineStats, RequestOutput, StepOutputs
from server.log import configure_logging

if TYPE_CHECKING:  # the engine imports torch: only the child process loads it
    from server.engine.core import Engine


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """The child's first message: the engine is built and serving."""

    pid: int
    model_name: str
    max_model_len: int
    vocab_size: int
    eos_token_id: int
    num_gpus: int


@dataclass(frozen=True, slots=True)
class EngineFailed:
    """The child's last message when building or stepping the engine raised."""

    reason: str
    bad_config: bool = False  # a ValueError while building: the flags, not a crash


class EngineStartError(RuntimeError):
    def __init__(self, reason: str, bad_config: bool) -> None:
        super().__init__(reason)
        self.bad_config = bad_config


class EngineDeadError(Exception):
    """The engine process is gone; the request cannot complete."""


class RequestCutError(Exception):
    """The API side ended the request before it finished (the server's shutdown deadline)."""


SHUTDOWN = None  # sent to the engine loop (child process or in-process thread) to make it exit cleanly
_MAX_MESSAGES_PER_READ = 32


def run_engine_process(config: EngineConfig, requests: Connection, outputs: Connection) -> None:
    """Child entry point. Exits on the shutdown message or when the parent's pipe closes."""
    # Ctrl-C and `kill -TERM -<pgid>` reach the whole process group; the parent decides when
    # the engine stops (after draining), and its death closes our pipe, which ends us too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    engine = None
    try:
        configure_logging()
        leave_a_core_for_http(config)
        from server.engine.core import Engine

        engine = Engine(config)
        # The model, torch and Triton are a great many long-lived objects: a full collection walking
        # them would stall whichever step it fell in. Frozen, the collector walks only what a step
        # allocates.
        gc.collect()  # start-up garbage in cycles goes now; frozen, it would never go
        gc.freeze()
        outputs.send(EngineInfo(os.getpid(), engine.model_name, engine.max_model_len,
                                engine.vocab_size, engine.eos_token_id, engine.num_gpus))
        serve_engine(engine, requests, outputs)
    except (EOFError, BrokenPipeError):
        return  # the parent is gone
    except ValueError as exc:
        if engine is None:  # Engine(config) refused the configuration: a plain message
            outputs.send(EngineFailed(str(exc), bad_config=True))
            raise SystemExit(2) from None
        _report_crash(outputs, exc)
    except BaseException as exc:  # report anything, then exit non-zero
        _report_crash(outputs, exc)


def _report_crash(outputs: Connection, exc: BaseException) -> None:
    outputs.send(EngineFailed(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    raise SystemExit(1) from None


def leave_a_core_for_http(config: EngineConfig) -> None:
    """On CPU, torch's OpenMP threads spin on every core; with the HTTP process competing for
    one of them, each parallel region waits for the thread that lost its core, and every step
    stalls. Keep one core free unless the user chose a thread count."""
    if "OMP_NUM_THREADS" in os.environ or resolve_device(config.device) != "cpu":
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, cores - 1))


class MessageSource(Protocol):
    """Where the engine loop reads requests: a pipe end, or the in-process transport's inbox."""

    def poll(self, timeout: float | None = ...) -> bool: ...

    def recv(self) -> Any: ...


class MessageSink(Protocol):
    """Where the engine loop sends its step outputs: a pipe end, or the in-process transport's outbox."""

    def send(self, obj: Any) -> None: ...


def serve_engine(engine: Engine, requests: MessageSource, outputs: MessageSink) -> None:
    while True:
        if not engine.has_unfinished():
            requests.poll(None)  # idle: sleep until a message (or EOF) arrives
        refused: list[RequestOutput] = []
        touched = False
        while requests.poll():
            msg = requests.recv()
            if msg is SHUTDOWN:
                return
            touched = True
            if isinstance(msg, AddRequest):
                try:
                    engine.add_request(msg)
                except ValueError as exc:
                    refused.append(RequestOutput(msg.request_id, (), True, "error", error=str(exc)))
            else:
                engine.abort(msg.request_id)
        if engine.has_unfinished():
            step = engine.step()
            outputs.send(StepOutputs(tuple(refused) + step.outputs, step.stats) if refused else step)
        elif touched:
            # No step to run, but aborts freed blocks or adds were refused: report the new state.
            outputs.send(StepOutputs(tuple(refused), engine.stats()))


class RequestStream:
    """One request's outputs in arrival order, each with its arrival time (monotonic)."""

    __slots__ = ("request_id", "_items", "_waiter", "_failure", "finished")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._items: collections.deque[tuple[RequestOutput, float]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._failure: Exception | None = None
        self.finished = False

    def push(self, output: RequestOutput, arrival: float) -> None:
        self._items.append((output, arrival))
        self.finished = output.finished
        self._wake()

    def fail(self, reason: str) -> None:
        """The engine died: once the outputs already here are taken, EngineDeadError."""
        self._failure = EngineDeadError(reason)
        self._wake()

    def cut(self, reason: str) -> None:
        """End the request early: once the outputs already here are taken, RequestCutError."""
        if self._failure is None:
            self._failure = RequestCutError(reason)
            self._wake()

    async def next_batch(self) -> list[tuple[RequestOutput, float]]:
        """Every output that arrived since the last call; waits for at least one."""
        while not self._items:
            if self._failure is not None:
                raise self._failure
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch = list(self._items)
        self._items.clear()
        return batch

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


@dataclass(frozen=True, slots=True)
class EngineProcess:
    """The started engine process and this side's ends of its two pipes."""

    process: multiprocessing.process.BaseProcess
    requests: Connection  # AddRequest / AbortRequest / SHUTDOWN to the engine
    outputs: Connection  # EngineInfo, then StepOutputs, from the engine


class EngineClient:
    """Starts the engine process and multiplexes requests over its pipes."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.stats = EngineStats()
        self.dead_reason: str | None = None
        self._streams: dict[str, RequestStream] = {}
        self._outbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._engine: EngineProcess | None = None  # from `start`
        self._on_death: Callable[[str], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # from `attach`

    @property
    def _started(self) -> EngineProcess:
        if self._engine is None:
            raise RuntimeError("EngineClient: the engine process is not started")
        return self._engine

    def start(self) -> EngineInfo:
        """Spawn the engine process and block until it is ready; EngineStartError if it fails."""
        ctx = multiprocessing.get_context("spawn")
        child_requests, requests = ctx.Pipe(duplex=False)
        outputs, child_outputs = ctx.Pipe(duplex=False)
        process = ctx.Process(target=run_engine_process, name="agentload-engine",
                              args=(self.config, child_requests, child_outputs))
        process.start()
        self._engine = EngineProcess(process, requests, outputs)
        # Close our copies of the child's ends so that its death reads as EOF here.
        child_requests.close()
        child_outputs.close()
        try:
            first = outputs.recv()
        except EOFError:
            first = EngineFailed(f"engine process {self._exit_description()} while starting")
        if isinstance(first, EngineFailed):
            process.join(5)
            raise EngineStartError(f"engine failed to start: {first.reason}", first.bad_config)
        threading.Thread(target=self._write_loop, name="engine-writer", daemon=True).start()
        return first

    def attach(self, loop: asyncio.AbstractEventLoop, on_death: Callable[[str], None]) -> None:
        """Start reading outputs on `loop`; `on_death(reason)` runs once if the engine dies."""
        self._loop = loop
        self._on_death = on_death
        loop.add_reader(self._started.outputs.fileno(), self._on_readable)

    def submit(self, request: AddRequest) -> RequestStream:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        stream = RequestStream(request.request_id)
        self._streams[request.request_id] = stream
        self._outbox.put(request)
        return stream

    def abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None and self.dead_reason is None:
            self._outbox.put(AbortRequest(request_id))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the child to exit; kill it if it does not within `timeout` seconds."""
        if self._engine is None:
            return
        process, outputs = self._engine.process, self._engine.outputs
        if self._loop is not None and not outputs.closed:
            self._loop.remove_reader(outputs.fileno())
        self._outbox.put(SHUTDOWN)
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()

    def _write_loop(self) -> None:
        requests = self._started.requests
        while True:
            msg = self._outbox.get()
            try:
                requests.send(msg)
            except (BrokenPipeError, OSError):
                return  # the reader sees EOF and reports the death
            if msg is SHUTDOWN:
                return

    def _on_readable(self) -> None:
        outputs = self._started.outputs
        try:
            # Bounded, so that a fast engine cannot starve the event loop; the reader fires again.
            for _ in range(_MAX_MESSAGES_PER_READ):
                if not outputs.poll():
                    break
                msg = outputs.recv()
                if isinstance(msg, StepOutputs):
                    self._dispatch(msg)
                elif isinstance(msg, EngineFailed):
                    self._die(f"engine process failed: {msg.reason}")
                    return
        except (EOFError, OSError):
            self._die(f"engine process {self._exit_description()}")

    def _dispatch(self, step: StepOutputs) -> None:
        self.stats = step.stats
        now = time.monotonic()
        streams = self._streams
        for output in step.outputs:
            stream = streams.get(output.request_id)
            if stream is None:
                continue  # aborted by the API side already
            stream.push(output, now)
            if output.finished:
                del streams[output.request_id]

    def _die(self, reason: str) -> None:
        """`reason` may carry a traceback: `on_death` (the log) gets it whole, HTTP answers
        (`dead_reason`, failed streams) its first line."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason.splitlines()[0]
        if self._loop is not None:  # always, once attached: only the attached reader sees a death
            self._loop.remove_reader(self._started.outputs.fileno())
        for stream in self._streams.values():
            stream.fail(self.dead_reason)
        self._streams.clear()
        if self._on_death is not None:
            self._on_death(reason)

    def _exit_description(self) -> str:
        process = self._started.process
        process.join(2)  # death path only: let the OS report the exit status
        code = process.exitcode
        if code is None:
            return "closed its pipe"
        if code < 0:
            return f"was killed by signal {signal.Signals(-code).name}"
        return f"exited unexpectedly with code {code}"
