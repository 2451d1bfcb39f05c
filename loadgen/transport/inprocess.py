"""In-process transport: the engine runs in this process and requests reach it without sockets.

The one place where loadgen imports the server (docs/architecture.md: `loadgen -> server` only here);
`server.engine.core` (torch) is imported only when the engine is built, so loadgen still imports
and runs `replay` without torch.

Threads: the synchronous `Engine` step loop runs in a background thread (torch releases the GIL
inside its ops). It is the API process's own loop, `server.engine_client.serve_engine`, reused as is:
the event loop hands it `AddRequest` / `AbortRequest` through a thread-safe inbox, and it hands
each step's `StepOutputs` back with `loop.call_soon_threadsafe`. A content chunk's time is when
the event loop receives that step's outputs (`time.perf_counter_ns`), as the HTTP transport
stamps a chunk when its bytes arrive; a request's coroutine wakes once, when it finishes.

What each request asks for is what the HTTP transport's body makes our server ask the engine:
`max_tokens` = `min_tokens` = the trace's output length, `ignore_eos`, the server's default
sampling. Failures map onto Exchange errors: a request the engine refuses (over the context or
the KV cache) is `engine_refused`; the per-request timeout and cancellation abort the request
in the engine; an engine that raises fails every request in flight with `engine_dead`, and every
later send with `connect` (as a dead server refuses connections), which ends the run with the
results measured so far.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from loadgen.defaults import DEFAULTS
from loadgen.telemetry.server_counters import ServerCounters
from loadgen.transport.base import (
    ErrorKind,
    Exchange,
    ServerInfo,
    Transport,
    TransportError,
    WireRequest,
)
from loadgen.transport.http import check_complete
from server.args import add_engine_args, engine_config_from_args
from server.config import EngineConfig, resolve_device
from server.engine.messages import AbortRequest, AddRequest, RequestOutput, SamplingParams, StepOutputs
from server.engine_client import SHUTDOWN, leave_a_core_for_http, serve_engine
from server.metrics import ServerMetrics
from server.protocol import speculative_card

if TYPE_CHECKING:
    from server.engine.core import Engine


class EngineConfigError(TransportError):
    """The engine refused its configuration while being built (e.g. no room for the KV cache)."""

__all__ = ["EngineConfig", "EngineConfigError", "InProcessTransport", "add_engine_args", "engine_config_from_args"]


class _Inbox:
    """The step thread's end of the request channel, with the poll/recv calls `serve_engine` makes on a
    multiprocessing Connection: `poll()` checks, `poll(None)` blocks until a message is queued."""

    def __init__(self) -> None:
        self._items: collections.deque[object] = collections.deque()
        self._ready = threading.Condition()

    def put(self, message: object) -> None:
        with self._ready:
            self._items.append(message)
            self._ready.notify()

    def poll(self, timeout: float | None = 0.0) -> bool:
        with self._ready:
            return self._ready.wait_for(lambda: bool(self._items), timeout)

    def recv(self) -> object:
        with self._ready:
            return self._items.popleft()


class _Outbox:
    """The step thread's end of the output channel: `send` (as `serve_engine` calls it) schedules the
    step's outputs on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver) -> None:
        self._loop = loop
        self._deliver = deliver

    def send(self, step: StepOutputs) -> None:
        self._loop.call_soon_threadsafe(self._deliver, step)


@dataclass(slots=True)
class _Pending:
    exchange: Exchange
    asked: int
    done: asyncio.Future


class InProcessTransport(Transport):
    """Drives `Engine(config)` in this process. The engine is built on the first `open` and kept
    across `close`/`open` (the replay opens once for server info and once for the run); `shutdown`
    frees it."""

    def __init__(self, config: EngineConfig, timeout_s: float = DEFAULTS.timeout_s) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.engine: Engine | None = None  # built by build_engine
        self.device = resolve_device(config.device)
        self.dead_reason: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox = _Inbox()
        self._thread: threading.Thread | None = None
        self._pending: dict[str, _Pending] = {}
        self._metrics: ServerMetrics | None = None  # made at the first /metrics asked for

    # -- lifecycle ---------------------------------------------------------------------------

    def build_engine(self) -> None:
        """Build the engine (blocking); EngineConfigError when it refuses the configuration."""
        if self.engine is not None:
            return
        leave_a_core_for_http(self.config)  # on CPU the event loop needs a core as HTTP would
        from server.engine.core import Engine

        try:
            self.engine = Engine(self.config)
        except ValueError as exc:
            raise EngineConfigError(str(exc)) from exc

    async def open(self, max_connections: int) -> None:
        if self._thread is not None:
            return
        self.build_engine()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._step_loop, args=(_Outbox(self._loop, self._deliver),),
                                        name="agentload-engine-steps", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop the step thread (aborting whatever is still in the engine); the engine is kept."""
        if self._thread is None:
            return
        for request_id in self._pending:
            self._inbox.put(AbortRequest(request_id))
        self._inbox.put(SHUTDOWN)
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        for entry in self._pending.values():  # aborted above: no output will come for them
            entry.exchange.end_ns = time.perf_counter_ns()
            entry.exchange.error, entry.exchange.error_detail = ErrorKind.CANCELLED, "the transport was closed"
            if not entry.done.done():
                entry.done.set_result(None)
        self._pending.clear()

    def shutdown(self) -> None:
        """Free the engine (and stop its tensor-parallel ranks, if any)."""
        if self.engine is not None:
            self.engine.runner.close()
            self.engine = None

    # -- the interface -----------------------------------------------------------------------

    async def server_info(self) -> ServerInfo:
        if self.engine is None:
            raise TransportError("the in-process engine is not built")
        engine = self.engine
        # Engine.num_gpus counts only rank 0; the runner knows the tensor-parallel size.
        num_gpus = engine.runner.num_gpus or None  # None on CPU: throughput per GPU uses 1
        raw = {"id": engine.model_name, "object": "model", "owned_by": "agentload",
               "max_model_len": engine.max_model_len, "num_gpus": engine.runner.num_gpus,
               "vocab_size": engine.vocab_size, "speculative": speculative_card(self.config.speculative),
               "transport": "inprocess", **self.device_info()}
        return ServerInfo(model=engine.model_name, ours=True, max_model_len=engine.max_model_len,
                          num_gpus=num_gpus, vocab_size=engine.vocab_size, raw=raw)

    async def send(self, request: WireRequest) -> Exchange:
        ex = Exchange()
        ex.start_ns = time.perf_counter_ns()
        if self.dead_reason is not None or self._thread is None:
            ex.end_ns = ex.start_ns
            ex.error = ErrorKind.CONNECT
            ex.error_detail = f"the in-process engine is not running: {self.dead_reason or 'transport closed'}"
            return ex
        rid = request.request_id
        assert self._loop is not None  # open() set it, before the step thread that _thread checks
        done = self._loop.create_future()
        self._pending[rid] = _Pending(ex, request.max_tokens, done)
        params = SamplingParams(max_tokens=request.max_tokens, min_tokens=request.max_tokens, ignore_eos=True,
                                acceptance_length=request.acceptance_length)
        self._inbox.put(AddRequest(rid, tuple(request.prompt.tolist()), params, time.monotonic()))
        try:
            await asyncio.wait_for(asyncio.shield(done), self.timeout_s)
        except asyncio.TimeoutError:
            ex.end_ns = time.perf_counter_ns()
            ex.error, ex.error_detail = ErrorKind.TIMEOUT, f"no complete answer within {self.timeout_s:g} s"
            self._abort(rid)
        except asyncio.CancelledError:
            self._abort(rid)
            raise
        return ex

    async def server_counters(self) -> ServerCounters | None:
        """The engine's count of kernels compiled while serving (its speculative counts come with
        each request's output)."""
        return None if self.engine is None else ServerCounters(None, self.engine.compiles_while_serving)

    async def metrics_text(self) -> str:
        """The engine's counters and gauges as our server's /metrics renders them."""
        if self.engine is None:
            raise TransportError("the engine is not built")
        if self._metrics is None:
            self._metrics = ServerMetrics(self.config.model.name)
        return self._metrics.render(self.engine.stats(), len(self._pending)).decode()

    def _abort(self, request_id: str) -> None:
        if self._pending.pop(request_id, None) is not None and self.dead_reason is None:
            self._inbox.put(AbortRequest(request_id))

    # -- the step thread and the event loop side ---------------------------------------------

    def _step_loop(self, outbox: _Outbox) -> None:
        try:
            assert self.engine is not None, "build_engine runs before the step thread starts"
            serve_engine(self.engine, self._inbox, outbox)
        except BaseException as exc:  # report anything: the run must end with a reason, not hang
            reason = f"{type(exc).__name__}: {exc}"
            details = traceback.format_exc()
            try:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._die, reason, details)
            except RuntimeError:  # the event loop is already closed
                print(f"loadgen: the in-process engine died: {details}", file=sys.stderr)

    def _deliver(self, step: StepOutputs) -> None:
        now = time.perf_counter_ns()
        pending = self._pending
        for output in step.outputs:
            entry = pending.get(output.request_id)
            if entry is None:
                continue  # aborted already (timeout, cancellation)
            ex = entry.exchange
            if output.new_token_ids:
                ex.chunk_ns.append(now)
                ex.chunk_tokens.append(len(output.new_token_ids))
            if output.finished:
                del pending[output.request_id]
                if self.config.speculative is not None:  # as our server's usage.spec_decode
                    ex.spec_num_drafts, ex.spec_num_accepted_tokens = output.num_drafts, output.num_accepted_tokens
                _finish(entry, output, now)

    def _die(self, reason: str, details: str) -> None:
        self.dead_reason = reason
        print(f"loadgen: the in-process engine died: {details}", file=sys.stderr, flush=True)
        now = time.perf_counter_ns()
        for entry in self._pending.values():
            entry.exchange.end_ns = now
            entry.exchange.error = ErrorKind.ENGINE_DEAD
            entry.exchange.error_detail = f"the in-process engine died: {reason}"
            if not entry.done.done():
                entry.done.set_result(None)
        self._pending.clear()

    def device_info(self) -> dict[str, Any]:
        """What the engine runs on, for the results file."""
        info: dict[str, Any] = {"device": self.device}
        if self.device == "cuda":
            import torch

            info["device_name"] = torch.cuda.get_device_name()
        return info

    def describe(self) -> dict[str, Any]:
        """The results config's target entry: in-process, the engine configuration, the device."""
        return {"transport": "inprocess", "engine": asdict(self.config), **self.device_info()}


def _finish(entry: _Pending, output: RequestOutput, now: int) -> None:
    ex = entry.exchange
    ex.end_ns = now
    if output.finish_reason == "error":
        ex.error, ex.error_detail = ErrorKind.ENGINE_REFUSED, output.error
    else:
        ex.usage_prompt_tokens = output.num_prompt_tokens
        ex.cached_tokens = output.num_cached_tokens
        check_complete(ex, entry.asked)
    entry.done.set_result(None)
