"""One keep-alive HTTP/1.1 connection and the response it reads: llhttp (the parser of Node.js,
through httptools) undoes the HTTP/1.1 framing in C and hands over the de-chunked body, whose
complete lines go to a callback, the body sink.

The body is not handed over line by line as it arrives: each read's complete lines are kept,
with the read's stamp, and the sink gets them in batches (at the end of the response, every
`BATCH_PIECES` pieces, or before a failure is raised), so the per-read work is one callback
and two list appends, and the sink can parse a whole batch of SSE events in one call. Stamps
are the same as if each line had been handed over when it was read. A request may ask for its
SSE content events to be counted by the compiled reader (`count_events`,
loadgen/transport/readpath.py); on the Python path the sink's counts are None and it counts them
itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httptools

from loadgen.transport.base import ErrorKind
from loadgen.transport.readpath import BODY_CHUNKED, BODY_UNTIL_CLOSE, COUNTED, NO_BODY, PIECES, WHOLE

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


class Connection(asyncio.Protocol):
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


def _is_chunked(headers: dict[str, str]) -> bool | None:
    """How a response body is framed: chunked (True), by Content-Length (False), or neither: it
    ends when the connection does (None)."""
    # chunked frames the body only as the last coding (as llhttp reads it)
    if headers.get("transfer-encoding", "").rpartition(",")[2].strip().lower() == "chunked":
        return True
    return False if "content-length" in headers else None
