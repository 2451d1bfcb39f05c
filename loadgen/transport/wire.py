"""A lean HTTP/1.1 client for streamed responses, on asyncio protocols with keep-alive pooling.

Why not aiohttp for the hot path: every streamed chunk through aiohttp's StreamReader wakes a
coroutine and runs several Python layers; measured on a 2-core machine that costs about 20
client CPU-microseconds per token before any SSE parsing. Here each socket read gets one
timestamp, llhttp (the parser of Node.js, through httptools) undoes the HTTP/1.1 framing in C
and hands over the de-chunked body, and complete body lines go to a callback; the waiting
coroutine wakes once, when the response is complete. llhttp replaced a hand-written parser:
about 0.5 µs per streamed event against 3.5 µs (benchmarks/RESULTS.md, "Client at scale").

The body is not handed over line by line as it arrives: each read's complete lines are kept,
with the read's stamp, and the sink gets them in batches (at the end of the response, every
`BATCH_PIECES` pieces, or before a failure is raised), so the per-read work is one callback
and two list appends, and the sink can parse a whole batch of SSE events in one call. Stamps
are the same as if each line had been handed over when it was read. A request may ask for its
SSE content events to be counted by the compiled reader (`count_events`, below); on the Python
path the sink's counts are None and it counts them itself.

Timestamps: plain-http connections are read with recvmsg and SO_TIMESTAMPNS on Linux, so a
read carries the kernel's arrival time, which a busy event loop cannot delay (see
_SocketTransport). https connections (and other systems) use the time of the read. The limit:
segments of one connection that queue while the loop is late are coalesced by the kernel into
one buffer that keeps only the newest stamp (even a one-byte MSG_PEEK reports it), so events of
a stream that wait together all get the last one's time. Kernel stamps make a late loop
harmless only up to one event interval; beyond that the client must keep up (--workers).

The compiled read path: where the extension module `_readpath` (loadgen/transport/_readpath.c)
is built, a plain-http connection on Linux is read by its `Reader`, a C callable registered as
the loop's reader callback: the recvmsg, the stamp, the body framing (chunked, Content-Length,
read-until-close) and the split into pieces of lines run in one compiled call per read, no
Python frame; it calls back here when a response head is complete (httptools parses it, as
below), for every batch of pieces, and at the message's end or a failure. The pieces, stamps,
batches and errors are the same as on the Python path (the wire tests run both), but for a head
or trailer over 64 KiB, malformed here only; https, other systems, a checkout built without a
C compiler and one whose build is of an older source (its READ_PATH_VERSION is not this
module's) take the Python path. The reader keeps a batch's pieces and their stamps itself until
the connection takes them (`deliver`); with `count_events` it also counts each piece that is one
plain SSE content event as it reads it (while its bytes are in the cache, instead of once more
at the batch) and hands it over as its count alone, the piece None (see _readpath.c).

Scope: what an OpenAI-compatible server needs: one request per connection at a time, request
bodies with Content-Length, responses with Content-Length, chunked, or read-until-close bodies,
http and https. Connections are reused while the server keeps them alive.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import socket
import ssl
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import httptools

from loadgen.transport.base import ErrorKind

log = logging.getLogger(__name__)

READ_PATH_VERSION = 4  # _readpath.c's: a build of another source is not used


def _current_build(module: Any) -> Any:
    """The compiled read path's module when it was built from this source (its READ_PATH_VERSION
    matches), else None: a build of an older source left in a checkout takes the Python paths."""
    return module if getattr(module, "READ_PATH_VERSION", None) == READ_PATH_VERSION else None


try:
    from loadgen.transport import _readpath as _built  # type: ignore[attr-defined]  # the compiled read path
except ImportError:  # built without a C compiler: the Python path reads every connection
    _built = None
_readpath = _current_build(_built)

# (body pieces, each one or more complete lines ending in b"\n" -- the last piece of a body may
# lack it --, the arrival perf_counter_ns of each piece, and None, or with `count_events` on the
# compiled path each piece's content tokens: > 0 for a piece counted as one plain SSE content
# event, which is None in the pieces, 0 for the others), in order
BodySink = Callable[[Sequence[bytes | None], list[int], list[int] | None], None]
BATCH_PIECES = 256  # pieces kept before they go to the sink mid-response (bounds the memory)


class ResponseError(Exception):
    """The request failed: `kind` is ErrorKind.CONNECT, ErrorKind.RESET, or ErrorKind.PROTOCOL (the body sink
    or the parser raised on what came back); `received` tells if any byte came back."""

    def __init__(self, kind: str, detail: str, received: bool) -> None:
        super().__init__(detail)
        self.kind = kind
        self.received = received


class Response:
    """Status, headers, (for non-2xx or non-streamed use) the body bytes, and when its last
    bytes arrived (perf_counter_ns; the kernel's stamp on raw sockets)."""

    __slots__ = ("status", "headers", "body", "end_ns")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.end_ns = 0


class _Conn(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time with llhttp (httptools), whose
    callbacks below receive the status, headers and de-chunked body pieces of each read."""

    # No instance dict: a read touches a few cache lines of its connection, not a dict's too
    # (hundreds of connections take turns, so each one's state is cold when its read comes).
    __slots__ = ("transport", "closed", "_parser", "_deadline", "_timer", "_timer_at", "_sink", "_count_events",
                 "_pieces", "_stamps", "_done", "_response", "_headers_done", "_until_close", "_line", "_keep_alive",
                 "_received", "_now", "reader")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reader: Any = None  # the compiled reader (_readpath.Reader) that keeps the pieces, if any
        self._parser = httptools.HttpResponseParser(self)
        self._deadline: float | None = None  # the current request's (loop.time()), None: no timeout
        self._timer: asyncio.Handle | None = None  # the connection's one timer, see `_arm`
        self._timer_at = 0.0  # when it is armed for (loop.time())
        self._reset(None, None, False)

    def _reset(self, sink: BodySink | None, done: asyncio.Future | None, count_events: bool) -> None:
        self._sink = sink
        self._count_events = count_events
        self._pieces: list[bytes] = []  # complete body lines not yet handed to the sink, and
        self._stamps: list[int] = []  # the arrival of each piece
        self._done = done
        self._response = Response()
        self._headers_done = False
        self._until_close = False  # a body with neither length nor chunking ends with the connection
        self._line = b""  # partial body line
        self._keep_alive = True
        self._received = False
        self._now = 0

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        done = self._done
        if done is None or done.done():
            return
        if self._until_close:
            try:
                self.on_message_complete()  # read-until-close body ends here
            except Exception as error:
                self._fail_unexpected(error)
            return
        detail = f"connection closed by the server{': ' + str(exc) if exc else ''}"
        self.deliver_before_failing()
        done.set_exception(ResponseError(ErrorKind.RESET, detail, self._received))

    def data_received(self, data: bytes) -> None:
        self.feed(data, time.perf_counter_ns())

    def feed(self, data: bytes, now: int) -> None:
        """Bytes that arrived by `now` (perf_counter_ns)."""
        self._received = True
        self._now = now
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
            if cause is not None:  # one of the callbacks below (the body sink) raised
                self._fail_unexpected(cause)
            else:
                self._fail(f"malformed HTTP response: {exc}",
                           ErrorKind.PROTOCOL if self._headers_done else ErrorKind.RESET)
        except Exception as exc:
            # Raised here it would end in the event loop's handler (raw sockets) and the rest
            # of the read would be lost while the request carried on; fail the request instead.
            self._fail_unexpected(exc)

    # -- llhttp callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._done is None or self._done.done():  # parsed on, it would replace the response
            raise ResponseError(ErrorKind.PROTOCOL, "bytes after the response's end", True)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._response.headers[name.decode("latin-1").lower()] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        response = self._response
        response.status = self._parser.get_status_code()
        if response.status != 200:
            self._sink = None  # an error body is kept whole, not streamed
        self._headers_done = True
        self._until_close = _is_chunked(response.headers) is None
        if int(response.headers.get("content-length", 0)) >= 1 << 63:  # llhttp takes up to 2^64 - 1,
            raise ValueError("Content-Length too large")  # the compiled reader counts in 63 bits

    def on_body(self, data: bytes) -> None:
        if self._sink is None:
            self._response.body += data
            return
        if not self._line and data[-1:] == b"\n":
            piece = data  # the usual piece: whole lines (one SSE event)
        elif b"\n" not in data:
            self._line += data
            return
        else:
            text = self._line + data
            end = text.rfind(b"\n") + 1
            piece, self._line = text[:end], text[end:]
        self._pieces.append(piece)
        self._stamps.append(self._now)
        if len(self._pieces) >= BATCH_PIECES:
            self.deliver()

    def on_message_complete(self) -> None:
        self._response.end_ns = self._now if not self._until_close else time.perf_counter_ns()
        self._keep_alive = self._parser.should_keep_alive() and not self._until_close
        if self._line and self._sink is not None:
            self._pieces.append(self._line)
            self._stamps.append(time.perf_counter_ns())
            self._line = b""
        self.deliver()
        self._until_close = False
        done = self._done
        if done is not None and not done.done():
            done.set_result(self._response)

    # -- called by the compiled reader (_readpath.Reader) ------------------------------------

    def take_head(self, head: bytes, now: int) -> tuple[int, int]:
        """A complete response head that arrived by `now`, parsed by a fresh llhttp parser (the
        compiled reader undoes the body's framing itself). Returns the body's framing -- its
        Content-Length, BODY_CHUNKED, BODY_UNTIL_CLOSE, or NO_BODY when the response is already
        complete or failed -- and how the body reaches the sink: WHOLE (it does not: on_body
        keeps it), PIECES, or COUNTED (pieces, the plain SSE content events counted by the reader)."""
        if self._done is None or self._done.done():  # no request waits for it: not ours to parse
            self._fail("bytes after the response's end", ErrorKind.PROTOCOL)
            return NO_BODY, WHOLE
        self._parser = httptools.HttpResponseParser(self)
        self.feed(head, now)
        if self.closed or self._done.done():
            return NO_BODY, WHOLE
        if not self._headers_done:  # the reader hands over a head that is not a response's
            self._fail("malformed HTTP response: no status line", ErrorKind.RESET)
            return NO_BODY, WHOLE
        chunked = _is_chunked(self._response.headers)
        if chunked is None:
            framing = BODY_UNTIL_CLOSE
        else:
            framing = BODY_CHUNKED if chunked else int(self._response.headers["content-length"])
        if self._sink is None:
            return framing, WHOLE
        return framing, COUNTED if self._count_events else PIECES

    def finish_body(self, line: bytes, now: int, end: bytes) -> None:
        """The body ended at `now`, with `line` its unterminated last line (b"" when none); a
        chunked body's `end` with a trailer (its last chunk and trailer) goes through llhttp,
        which takes the trailer's fields and completes the message; a body of other framing, or
        chunked without a trailer (`end` b""), completes here."""
        self._line = line
        if end:
            self.feed(end, now)
            return
        self._now = now
        try:
            self.on_message_complete()
        except Exception as error:
            self._fail_unexpected(error)

    def malformed_body(self, detail: str) -> None:
        self._fail(f"malformed HTTP response: {detail}", ErrorKind.PROTOCOL)

    def deliver(self) -> None:
        """Hand the kept body lines to the sink (the sink may raise): the compiled reader's first,
        then the ones kept here (the Python path's, or a body's unterminated last line)."""
        if self.reader is not None:
            batch = self.reader.take_batch()
            if batch is not None and self._sink is not None:
                self._sink(*batch)
        if self._pieces and self._sink is not None:
            pieces, stamps = self._pieces, self._stamps
            self._pieces, self._stamps = [], []
            self._sink(pieces, stamps, None)

    def deliver_before_failing(self) -> None:
        """What arrived before a failure still goes to the sink, as it would have line by line;
        a sink that raises now adds nothing to the failure that is being reported."""
        try:
            self.deliver()
        except Exception:
            self._pieces, self._stamps = [], []

    def _fail(self, detail: str, kind: str = ErrorKind.RESET) -> None:
        self._keep_alive = False
        self._until_close = False
        self.deliver_before_failing()
        if self._done is not None and not self._done.done():
            self._done.set_exception(ResponseError(kind, detail, True))
        if self.transport is not None:
            self.transport.close()

    def _fail_unexpected(self, exc: BaseException) -> None:
        self._fail(f"reading the response raised {type(exc).__name__}: {exc}", ErrorKind.PROTOCOL)

    # -- used by the pool --------------------------------------------------------------------

    def start(self, request: bytes, sink: BodySink | None, done: asyncio.Future,
              deadline: float | None = None, count_events: bool = False) -> None:
        """Send `request`; `done` gets the response, or asyncio.TimeoutError at `deadline`
        (loop.time()) when the response is not complete by then. `count_events`: the compiled
        reader counts the body's plain SSE content events for the sink (BodySink)."""
        self._reset(sink, done, count_events)
        assert self.transport is not None, "start() on a connection that was never made"
        self._deadline = deadline
        if deadline is not None and (self._timer is None or self._timer_at > deadline):
            self._arm(deadline)
        self.transport.write(request)

    # A request's timeout: one timer per connection, not a call_at and a cancel per request. The
    # timer stays armed at an earlier request's deadline; when it fires before the current
    # request's, it re-arms at that one, so a request still expires exactly at its own deadline.

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        # Kept here, not asked of the handle: uvloop answers a deadline less than a millisecond
        # ahead (or past, as a late loop re-arms) with a plain Handle, which has no when().
        self._timer_at = deadline
        self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        assert self._timer is not None  # only the armed handle calls this: _arm and connection_lost cancel
        fired_at = self._timer_at
        self._timer = None
        done, deadline = self._done, self._deadline
        if done is None or done.done() or deadline is None or self.closed:
            return  # no request waiting, or one without a timeout: the next start arms it
        if fired_at < deadline:
            self._arm(deadline)  # armed for an earlier request
        else:
            done.set_exception(asyncio.TimeoutError())

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive and self._done is not None and self._done.done()


class _SocketTransport:
    """Drives a _Conn from a non-blocking TCP socket read with recvmsg, so each read carries the
    kernel's receive timestamp (SO_TIMESTAMPNS, Linux): the time the bytes reached the socket,
    not the later moment a busy event loop got round to reading them. Without the option (other
    systems) the read time is used, as the protocol path does. With `compiled` the reads are the
    compiled reader's (_readpath.Reader, see the module's docstring) instead of _readable's."""

    __slots__ = ("_sock", "_conn", "_loop", "_fd", "_out", "_open", "_recvmsg", "_feed")

    def __init__(self, sock: socket.socket, conn: _Conn, compiled: bool) -> None:
        self._sock = sock
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._fd = sock.fileno()
        self._out: memoryview | None = None
        self._open = True
        self._recvmsg = sock.recvmsg
        self._feed = conn.feed
        _enable_rx_timestamps(sock)
        conn.connection_made(self)  # type: ignore[arg-type]
        if compiled:
            conn.reader = _readpath.Reader(self._fd, conn, self._lost)
        self._loop.add_reader(self._fd, conn.reader.readable if compiled else self._readable)

    def write(self, data: bytes) -> None:
        if self._out is not None:
            self._out = memoryview(bytes(self._out) + data)
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lost(exc)
            return
        if sent < len(data):
            self._out = memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        out = self._out
        assert out is not None, "the writer is registered only while output is pending"
        try:
            sent = self._sock.send(out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        self._out = out[sent:]
        if not len(self._out):
            self._out = None
            self._loop.remove_writer(self._fd)

    def _readable(self) -> None:
        # The hot path, once per read: bound methods made once, no other call than the stamp's.
        try:
            data, ancillary, _, _ = self._recvmsg(READ_SIZE, _ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if data:
            self._feed(data, _stamp(ancillary))
        else:
            self._lost(None)

    def close(self) -> None:
        self._lost(None)

    def _lost(self, exc: Exception | None) -> None:
        if not self._open:
            return
        self._open = False
        self._loop.remove_reader(self._fd)
        if self._out is not None:
            self._loop.remove_writer(self._fd)
        self._sock.close()
        self._conn.connection_lost(exc)


READ_SIZE = 1 << 16  # larger buffers cost more per read (allocation) than they save
_SO_TIMESTAMPNS = 35  # Linux, all architectures Python runs on; not exported by the socket module
_TIMESPEC = struct.Struct("@ll")  # option 35's stamp: two C longs (SO_TIMESTAMPNS_OLD's timespec)
_unpack_timespec = _TIMESPEC.unpack_from
_ANCILLARY_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


class _RealtimeToPerfCounter:
    """Kernel timestamps are CLOCK_REALTIME; perf_counter_ns is CLOCK_MONOTONIC. The offset
    between them is re-read every 50 ms of stamps, so clock slewing cannot accumulate."""

    REFRESH_NS = 50_000_000
    READS = 3  # offset readings per refresh; the tightest bracket wins

    def __init__(self) -> None:
        self._offset = 0
        self._valid_until = 0

    def stamp(self, ancillary: list) -> int:
        """The kernel's receive time of a read (perf_counter_ns), or now when it carries none."""
        if ancillary:
            _, kind, raw = ancillary[0]
            if kind == _SO_TIMESTAMPNS:  # the only message asked for
                seconds, nanoseconds = _unpack_timespec(raw)
                realtime_ns = seconds * 1_000_000_000 + nanoseconds
                if realtime_ns >= self._valid_until:
                    self._offset = self.offset()
                    self._valid_until = realtime_ns + self.REFRESH_NS
                return realtime_ns - self._offset
        return time.perf_counter_ns()

    @classmethod
    def offset(cls) -> int:
        """CLOCK_REALTIME - CLOCK_MONOTONIC, from the realtime reading bracketed most tightly by two
        monotonic ones: a thread preempted between two bare reads would shift every stamp of the
        next 50 ms by the time it lost (tens of microseconds on a busy host, seen in a test)."""
        best_width, best = None, 0
        for _ in range(cls.READS):
            before = time.perf_counter_ns()
            realtime = time.time_ns()
            after = time.perf_counter_ns()
            if best_width is None or after - before < best_width:
                best_width, best = after - before, realtime - (before + after) // 2
        return best


_stamp = _RealtimeToPerfCounter().stamp


def compiled_reads_available() -> bool:
    """Whether plain-http connections can be read by the compiled reader (built, and Linux)."""
    return _readpath is not None and sys.platform.startswith("linux")


def content_token_counter() -> Callable[[list[bytes]], list[int]] | None:
    """The compiled counter of a batch of SSE content events' token ids, one count per piece and
    0 for a piece it leaves to orjson (_readpath.c's count_content_tokens, used by
    http._SseStream), or None where the extension is not built."""
    return _readpath.count_content_tokens if _readpath is not None else None


def _is_chunked(headers: dict[str, str]) -> bool | None:
    """How a response body is framed: chunked (True), by Content-Length (False), or neither: it
    ends when the connection does (None)."""
    # chunked frames the body only as the last coding (as llhttp reads it)
    if headers.get("transfer-encoding", "").rpartition(",")[2].strip().lower() == "chunked":
        return True
    return False if "content-length" in headers else None


NO_BODY, BODY_CHUNKED, BODY_UNTIL_CLOSE = -1, -2, -3  # framings besides a length (_readpath.c's)
WHOLE, PIECES, COUNTED = 0, 1, 2  # how a body reaches the connection (take_head; _readpath.c's)
if _readpath is not None:
    _readpath.configure(_RealtimeToPerfCounter.offset, _RealtimeToPerfCounter.REFRESH_NS, READ_SIZE, BATCH_PIECES)


def _enable_rx_timestamps(sock: socket.socket) -> None:
    if sys.platform.startswith("linux"):
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        except OSError:
            pass  # reads then carry no stamp and take the read time


class _Slots:
    """A semaphore (first come, first served; a waiter cancelled as it is handed a slot passes it
    on) whose free slot is taken without a coroutine: asyncio.Semaphore's `async with` costs
    two coroutines per request even when no one waits."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting: deque[asyncio.Future] = deque()

    def take_free(self) -> bool:
        """Take a slot if one is free and no one waits for it (else `take`)."""
        if self._free and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.give()  # handed a slot just as the caller was cancelled
            raise

    def give(self) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():  # a cancelled waiter takes no slot
                future.set_result(None)
                return
        self._free += 1


FILES_BESIDES_POOL = 64  # descriptors a client process holds besides its pool's sockets (the loop, pipes, files)


def _allow_open_files(connections: int) -> None:
    """Raise this process's soft limit on open files to fit `connections` sockets and the rest,
    up to the hard limit. The common soft limit is 1024: a larger pool's next connection would
    fail with EMFILE, which is counted as a refused connection and, five in a row, ends the run
    as a dead server."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = connections + FILES_BESIDES_POOL
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass  # a system that caps it below the hard limit (macOS's OPEN_MAX): the soft limit stays


class HttpClient:
    """Requests to one origin over a pool of keep-alive connections."""

    def __init__(self, base_url: str, headers: dict[str, str], max_connections: int,
                 kernel_timestamps: bool = True, compiled: bool = True) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"--url: expected http://HOST:PORT or https://HOST:PORT, got {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        # raw sockets with kernel receive stamps for plain http; asyncio's transports otherwise
        self._raw_sockets = kernel_timestamps and self._ssl is None and hasattr(socket, "CMSG_SPACE")
        # raw sockets on Linux are read by the compiled reader where it is built
        self._compiled = compiled and self._raw_sockets and compiled_reads_available()
        self.read_path = "compiled" if self._compiled else "python"
        if compiled and self._raw_sockets and _readpath is None and sys.platform.startswith("linux"):
            _warn_python_reads()
        host_header = url.netloc.rpartition("@")[2]
        fixed = {"Host": host_header, "User-Agent": "agentload", "Accept": "*/*", **headers}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: list[_Conn] = []
        self._slots = _Slots(max_connections)
        _allow_open_files(max_connections)
        self._open: set[_Conn] = set()

    async def request(self, method: str, path: str, body: bytes = b"", headers: str = "",
                      sink: BodySink | None = None, timeout: float | None = None,
                      count_events: bool = False) -> Response:
        """Send one request; body lines go to `sink` in batches (else into Response.body), with
        `count_events` the compiled reader's counts of its SSE content events (BodySink).
        Raises ResponseError (connect/reset) or asyncio.TimeoutError."""
        head = (f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._fixed}{headers}"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
        slots = self._slots
        if not slots.take_free():  # the usual case, without a coroutine
            await slots.take()
        try:
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            for attempt in (0, 1):
                conn = self._idle_connection()  # the usual case, without a coroutine
                reused = conn is not None
                if conn is None:
                    conn = await self._connect_by(deadline)
                done = loop.create_future()
                conn.start(head + body, sink, done, deadline, count_events)
                try:
                    response = await done
                except ResponseError as exc:
                    self._discard(conn)
                    # a kept-alive connection the server had already closed: retry once, fresh
                    if reused and not exc.received and attempt == 0:
                        continue
                    raise
                except BaseException:  # the timeout, or the caller cancelled
                    conn.deliver_before_failing()
                    self._discard(conn)
                    raise
                if conn.reusable:
                    self._idle.append(conn)
                else:
                    self._discard(conn)
                return response
        finally:
            slots.give()
        raise AssertionError("unreachable")

    def _idle_connection(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._open.discard(conn)
        return None

    async def _connect_by(self, deadline: float | None) -> _Conn:
        loop = asyncio.get_running_loop()
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            conn = await asyncio.wait_for(self._connect(loop), timeout)
        except OSError as exc:
            raise ResponseError(ErrorKind.CONNECT, f"cannot connect to {self.host}:{self.port}: {exc}", False) from exc
        self._open.add(conn)
        return conn

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Conn:
        if not self._raw_sockets:
            _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self._ssl)
            return conn
        last: OSError = OSError(f"no address for {self.host}")
        for family, kind, proto, _, address in await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            except BaseException:
                sock.close()
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn()
            _SocketTransport(sock, conn, self._compiled)
            return conn
        raise last

    def _discard(self, conn: _Conn) -> None:
        self._open.discard(conn)
        if conn.transport is not None and not conn.closed:
            conn.transport.close()

    async def close(self) -> None:
        for conn in list(self._open):
            self._discard(conn)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


@functools.cache  # once per process
def _warn_python_reads() -> None:
    log.warning("the compiled read path (loadgen/transport/_readpath.c) is not built, or was built from an older "
                "source: plain-http reads take the Python path, a few CPU-microseconds more per streamed token "
                "(rebuild: pip install -e . with a C compiler)")

