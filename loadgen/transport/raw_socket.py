"""A connection read from a raw non-blocking socket, so each read carries the kernel's receive time.

Plain-http connections are read with recvmsg and SO_TIMESTAMPNS on Linux, so a read carries the
kernel's arrival time, which a busy event loop cannot delay. https connections (and other
systems) use the time of the read (asyncio's transports, loadgen/transport/wire.py). The limit:
segments of one connection that queue while the loop is late are coalesced by the kernel into
one buffer that keeps only the newest stamp (even a one-byte MSG_PEEK reports it), so events of
a stream that wait together all get the last one's time. Kernel stamps make a late loop
harmless only up to one event interval; beyond that the client must keep up (--workers).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time

from loadgen.transport.connection import BATCH_PIECES, Connection
from loadgen.transport.readpath import configure, new_reader

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
        next 50 ms by the time it lost."""
        best_width, best = None, 0
        for _ in range(cls.READS):
            before = time.perf_counter_ns()
            realtime = time.time_ns()
            after = time.perf_counter_ns()
            if best_width is None or after - before < best_width:
                best_width, best = after - before, realtime - (before + after) // 2
        return best


_stamp = _RealtimeToPerfCounter().stamp


def enable_rx_timestamps(sock: socket.socket) -> None:
    if sys.platform.startswith("linux"):
        try:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        except OSError:
            pass  # reads then carry no stamp and take the read time


class SocketTransport:
    """Drives a Connection from a non-blocking TCP socket read with recvmsg, so each read carries the
    kernel's receive timestamp (SO_TIMESTAMPNS, Linux): the time the bytes reached the socket,
    not the later moment a busy event loop got round to reading them. Without the option (other
    systems) the read time is used, as the protocol path does. With `compiled` the reads are the
    compiled reader's (loadgen/transport/readpath.py) instead of _readable's."""

    __slots__ = ("_sock", "_conn", "_loop", "_fd", "_out", "_open", "_recvmsg", "_feed")

    def __init__(self, sock: socket.socket, conn: Connection, compiled: bool) -> None:
        self._sock = sock
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._fd = sock.fileno()
        self._out: memoryview | None = None
        self._open = True
        self._recvmsg = sock.recvmsg
        self._feed = conn.feed
        enable_rx_timestamps(sock)
        conn.connection_made(self)  # type: ignore[arg-type]
        if compiled:
            conn.reader = new_reader(self._fd, conn, self._lost)
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


configure(_RealtimeToPerfCounter.offset, _RealtimeToPerfCounter.REFRESH_NS, READ_SIZE, BATCH_PIECES)
