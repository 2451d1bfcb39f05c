"""A lean HTTP/1.1 client for streamed responses, on asyncio protocols with keep-alive pooling.

Why not aiohttp for the hot path: every streamed chunk through aiohttp's StreamReader wakes a
coroutine and runs several Python layers before any SSE parsing. Here each socket read gets one
timestamp (the kernel's, on plain http: loadgen/transport/raw_socket.py), llhttp undoes the
HTTP/1.1 framing in C (loadgen/transport/connection.py) or the compiled reader reads the socket
and the framing in one call (loadgen/transport/readpath.py), and complete body lines go to a
callback in batches; the waiting coroutine wakes once, when the response is complete.

Scope: what an OpenAI-compatible server needs: one request per connection at a time, request
bodies with Content-Length, responses with Content-Length, chunked, or read-until-close bodies,
http and https. Connections are reused while the server keeps them alive.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import ssl
import sys
from collections import deque
from urllib.parse import urlsplit

from loadgen.transport.base import ErrorKind
from loadgen.transport.connection import BodySink, Connection, Response, ResponseError
from loadgen.transport.raw_socket import SocketTransport
from loadgen.transport.readpath import compiled_reads_available, warn_python_reads


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
        if compiled and self._raw_sockets and sys.platform.startswith("linux") and not compiled_reads_available():
            warn_python_reads()
        host_header = url.netloc.rpartition("@")[2]
        fixed = {"Host": host_header, "User-Agent": "agentload", "Accept": "*/*", **headers}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: list[Connection] = []
        self._slots = _Slots(max_connections)
        _allow_open_files(max_connections)
        self._open: set[Connection] = set()

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

    def _idle_connection(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._open.discard(conn)
        return None

    async def _connect_by(self, deadline: float | None) -> Connection:
        loop = asyncio.get_running_loop()
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            conn = await asyncio.wait_for(self._connect(loop), timeout)
        except OSError as exc:
            raise ResponseError(ErrorKind.CONNECT, f"cannot connect to {self.host}:{self.port}: {exc}", False) from exc
        self._open.add(conn)
        return conn

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> Connection:
        if not self._raw_sockets:
            _, conn = await loop.create_connection(Connection, self.host, self.port, ssl=self._ssl)
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
            conn = Connection()
            SocketTransport(sock, conn, self._compiled)
            return conn
        raise last

    def _discard(self, conn: Connection) -> None:
        self._open.discard(conn)
        if conn.transport is not None and not conn.closed:
            conn.transport.close()

    async def close(self) -> None:
        for conn in list(self._open):
            self._discard(conn)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

