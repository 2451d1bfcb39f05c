"""The lean HTTP/1.1 client against a raw TCP server that splits responses at awkward places."""

from __future__ import annotations

import asyncio
import random
import resource
import socket
import struct
import sys
import threading
import time

import pytest

from loadgen.transport import connection, raw_socket, readpath, wire
from loadgen.transport.connection import ResponseError
from loadgen.transport.wire import HttpClient
from tests.loadgen.conftest import REQUIRE_READPATH, HandTransport, require_compiled_reads

SSE = b"".join(b'data: {"n": %d}\n\n' % i for i in range(20)) + b"data: [DONE]\n\n"


# Every test runs on each way a response is read: raw sockets with kernel stamps through the
# compiled reader (loadgen/transport/_readpath.c) or the Python path, and asyncio's transports.
READ_PATHS = ["compiled", "raw-socket", "asyncio-transport"]


def _require(read_path: str) -> None:
    if read_path == "compiled":
        require_compiled_reads()


def _client(url: str, headers: dict[str, str], read_path: str) -> HttpClient:
    _require(read_path)
    client = HttpClient(url, headers, 4, kernel_timestamps=read_path != "asyncio-transport",
                        compiled=read_path == "compiled")
    assert client.read_path == ("compiled" if read_path == "compiled" else "python")
    return client


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for size in sizes:
        piece = body[pos:pos + size]
        if not piece:
            break
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
        pos += size
    return out + b"0\r\n\r\n"


async def _serve(responses: list[bytes], split: int | None, close_after: bool = False):
    """Answer each request on a connection with the next response, in `split`-byte writes."""
    seen: list[bytes] = []
    queue = list(responses)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while queue:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            seen.append(head + await reader.readexactly(length))
            data = queue.pop(0)
            step = split or len(data)
            for pos in range(0, len(data), step):
                writer.write(data[pos:pos + step])
                await writer.drain()
                await asyncio.sleep(0.001)
            if close_after:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def _lines(sink_lines: list) -> list[bytes]:
    return [line for line, _ in sink_lines if line.startswith(b"data:")]


def _line_sink(got: list):
    """A body sink that records (line, arrival) for every line of every piece it is given."""
    def sink(pieces: list[bytes], stamps: list[int], counts: None) -> None:
        assert len(pieces) == len(stamps) and counts is None
        got.extend((line, now) for piece, now in zip(pieces, stamps) for line in piece.split(b"\n") if line)
    return sink


@pytest.mark.parametrize("read_path", READ_PATHS)
@pytest.mark.parametrize("split", [1, 2, 3, 7, None])
def test_chunked_stream_split_anywhere(split, read_path):
    async def main():
        rng = random.Random(split)
        sizes = [rng.randint(1, 40) for _ in range(100)]
        response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(SSE, sizes)
        server, port, seen = await _serve([response, response], split)
        client = _client(f"http://127.0.0.1:{port}", {"X-A": "b"}, read_path)
        for _ in range(2):  # the second request reuses the kept-alive connection
            got: list = []
            resp = await client.request("POST", "/v1/completions", b"{}", sink=_line_sink(got),
                                        timeout=10)
            assert resp.status == 200
            assert _lines(got) == [line for line in SSE.split(b"\n") if line]
            times = [t for _, t in got]
            assert times == sorted(times)
        assert len(client._open) == 1
        assert seen[0].startswith(b"POST /v1/completions HTTP/1.1\r\n") and b"X-A: b\r\n" in seen[0]
        await client.close()
        server.close()

    asyncio.run(main())


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_content_length_and_until_close_bodies_and_error_status(read_path):
    async def main():
        responses = [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(SSE) + SSE,
                     b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops"]
        server, port, _ = await _serve(responses, 5)
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        got: list = []
        await client.request("POST", "/x", b"1", sink=_line_sink(got), timeout=10)
        assert len(_lines(got)) == 21
        resp = await client.request("POST", "/x", b"1", sink=_line_sink(got), timeout=10)
        assert resp.status == 500 and resp.body == b"oops"
        server.close()
        until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + SSE
        server, port, _ = await _serve([until_close], 9, close_after=True)
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        got = []
        await client.request("POST", "/x", b"1", sink=_line_sink(got), timeout=10)
        assert len(_lines(got)) == 21
        server.close()

    asyncio.run(main())


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_a_stale_kept_alive_connection_is_retried_once(read_path):
    async def main():
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
        server, port, seen = await _serve([ok, ok], None, close_after=True)  # closes after each answer
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        assert (await client.request("GET", "/", timeout=10)).body == b"hi"
        await asyncio.sleep(0.05)
        assert (await client.request("GET", "/", timeout=10)).body == b"hi"
        assert len(seen) == 2
        server.close()

    asyncio.run(main())


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_refused_reset_and_timeout(read_path):
    async def main():
        client = _client("http://127.0.0.1:9", {}, read_path)
        with pytest.raises(ResponseError) as refused:
            await client.request("GET", "/", timeout=5)
        assert refused.value.kind == "connect"
        cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(SSE, [30, 30])[:70]
        server, port, _ = await _serve([cut], 16, close_after=True)
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        with pytest.raises(ResponseError) as reset:
            await client.request("POST", "/x", b"", sink=_line_sink([]), timeout=5)
        assert reset.value.kind == "reset" and reset.value.received
        server.close()

        async def silent(reader, writer):
            await asyncio.sleep(5)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        client = _client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {}, read_path)
        with pytest.raises(asyncio.TimeoutError):
            await client.request("GET", "/", timeout=0.2)
        server.close()

    asyncio.run(main())


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_each_request_on_a_kept_alive_connection_expires_at_its_own_deadline(read_path):
    """The connection keeps one timer armed at an earlier request's deadline: a later request with
    a nearer deadline still expires at it, and one with a farther deadline outlives the old one."""
    async def main():
        delays = iter([0.0, 0.6, 0.0, 5.0])  # the server's wait before each answer, in order

        async def answer(reader, writer):
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                await asyncio.sleep(next(delays))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        client = _client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {}, read_path)
        assert (await client.request("GET", "/", timeout=0.2)).body == b"hi"
        assert (await client.request("GET", "/", timeout=10)).body == b"hi"  # past the first's deadline
        assert (await client.request("GET", "/", timeout=10)).body == b"hi"
        with pytest.raises(asyncio.TimeoutError):  # nearer than the timer armed at the one before
            await client.request("GET", "/", timeout=0.2)
        await client.close()
        server.close()

    asyncio.run(main())


def test_a_late_loop_still_times_out_a_request_whose_deadline_passed_meanwhile():
    """The timer fires late, for an earlier request's deadline, when the current request's has
    passed too: it re-arms at a deadline in the past, which uvloop answers with a plain handle
    (no when()), and the request still times out."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn = connection.Connection()
        conn.connection_made(HandTransport(conn))
        first, second = loop.create_future(), loop.create_future()
        conn.start(b"", None, first, loop.time() + 0.02)
        first.set_result(None)  # answered: the timer stays armed at its deadline
        conn.start(b"", None, second, loop.time() + 0.03)
        time.sleep(0.06)  # the loop is late past both deadlines
        await asyncio.wait({second}, timeout=1)
        assert second.done() and isinstance(second.exception(), asyncio.TimeoutError)

    uvloop.run(main())


def test_connection_slots_admit_in_order_and_a_cancelled_waiter_takes_none():
    async def main():
        slots = wire._Slots(1)
        assert slots.take_free() and not slots.take_free()
        admitted: list[str] = []

        async def wait_for_slot(name: str) -> None:
            await slots.take()
            admitted.append(name)

        def waiters(*names: str) -> list[asyncio.Task]:
            return [asyncio.ensure_future(wait_for_slot(name)) for name in names]

        a, b, c = waiters("a", "b", "c")
        await asyncio.sleep(0)
        b.cancel()  # while it waits
        slots.give()
        await asyncio.sleep(0)
        slots.give()
        await asyncio.gather(a, c)
        assert admitted == ["a", "c"] and b.cancelled()
        d, e = waiters("d", "e")
        await asyncio.sleep(0)
        slots.give()  # c's slot, handed to d ...
        d.cancel()  # ... cancelled before it runs: d passes the slot on to e
        await asyncio.wait([d, e], timeout=5)  # e is never admitted if d kept the slot
        assert admitted == ["a", "c", "e"] and d.cancelled()
        slots.give()  # e's: the slot is free again
        assert slots.take_free() and not slots.take_free()

    asyncio.run(main())


def test_bad_url_is_named():
    with pytest.raises(ValueError, match="--url"):
        HttpClient("ftp://x", {}, 1)


def test_a_pool_larger_than_the_open_files_limit_raises_the_limit():
    """Under the common soft limit of 1024 descriptors a pool of thousands of connections
    (conc 4096 in one process) failed its 1025th connect with EMFILE, counted as refused, and the
    run ended as `server_dead`: the client now raises its soft limit as far as the hard one allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000 + wire.FILES_BESIDES_POOL:
        pytest.skip(f"the hard limit on open files here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        HttpClient("http://127.0.0.1:1", {}, 100)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 256  # enough already: left alone
        HttpClient("http://127.0.0.1:1", {}, 2000)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 2000 + wire.FILES_BESIDES_POOL
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_kernel_stamps_are_arrival_times_not_read_times(read_path):
    """Data that arrives while the loop is blocked: the raw-socket path records when it arrived,
    the asyncio-transport path only when the loop could read it."""
    _require(read_path)  # before the answering thread starts
    listener = socket.create_server(("127.0.0.1", 0))
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(SSE, [len(SSE)])

    asked = threading.Event()

    def answer_late() -> None:  # another thread: answers 50 ms after the request
        conn, _ = listener.accept()
        conn.recv(65536)
        asked.set()
        time.sleep(0.05)
        conn.sendall(response)
        time.sleep(0.5)
        conn.close()

    thread = threading.Thread(target=answer_late)
    thread.start()

    async def main() -> list[int]:
        client = _client(f"http://127.0.0.1:{listener.getsockname()[1]}", {}, read_path)
        lines: list = []
        task = asyncio.ensure_future(client.request("POST", "/x", b"", sink=_line_sink(lines), timeout=10))
        while not asked.is_set():  # the request went out
            await asyncio.sleep(0.001)
        blocked = time.perf_counter_ns()
        time.sleep(0.3)  # the answer arrives while this loop cannot run
        await task
        await client.close()
        return [t - blocked for _, t in lines]

    offsets = asyncio.run(main())
    thread.join()
    listener.close()
    if read_path != "asyncio-transport":
        assert offsets and all(t < 250_000_000 for t in offsets)
    else:
        assert offsets and all(t >= 300_000_000 for t in offsets)


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_a_large_request_body_is_sent_whole(read_path):
    """A long prompt (megabytes of JSON) does not fit the socket buffer in one send."""
    async def main():
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        server, port, seen = await _serve([ok], None)
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        body = bytes(range(256)) * 16384  # 4 MiB
        assert (await client.request("POST", "/x", body, timeout=30)).body == b"ok"
        assert seen[0].endswith(body)
        await client.close()
        server.close()

    asyncio.run(main())


class _SinkBroke(Exception):
    pass


def _sink_raising_on(bad: bytes):
    def sink(pieces: list[bytes], stamps: list[int], counts: None) -> None:
        for line in b"".join(pieces).split(b"\n"):
            if line == bad:
                raise _SinkBroke(f"cannot take {line!r}")
    return sink


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_a_sink_that_raises_fails_its_request_as_a_protocol_error(read_path):
    async def main():
        chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(SSE, [len(SSE)])
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
        server, port, _ = await _serve([chunked, ok], None)
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        with pytest.raises(ResponseError) as broke:  # raised on a line with lines after it
            await client.request("POST", "/x", b"", sink=_sink_raising_on(b'data: {"n": 2}'), timeout=5)
        assert broke.value.kind == "protocol" and "_SinkBroke" in str(broke.value)
        assert not client._open  # the connection's state is unknown: it is not reused
        server.close()
        # a read-until-close body whose last, unterminated line is delivered when the server closes
        until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: a\n\ndata: b"
        server, port, _ = await _serve([until_close], None, close_after=True)
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        with pytest.raises(ResponseError) as broke:
            await client.request("POST", "/x", b"", sink=_sink_raising_on(b"data: b"), timeout=5)
        assert broke.value.kind == "protocol" and "_SinkBroke" in str(broke.value)
        server.close()

    asyncio.run(main())


def test_kernel_stamps_convert_with_the_tightest_clock_offset(monkeypatch):
    """A kernel stamp (CLOCK_REALTIME) maps onto perf_counter_ns through the offset read between two
    monotonic readings; a realtime reading that lands late in its bracket (the thread preempted)
    loses to a tighter one instead of shifting every stamp of the next 50 ms."""
    import struct
    import time

    # (before, after) monotonic pairs and the realtime read between them; true offset 5 s
    monotonic = iter([1_000, 91_100,  # preempted after `before`: realtime read 90 us late
                      100_000, 100_200,  # 200 ns wide
                      200_000, 200_900])  # 900 ns wide
    realtime = iter([5_000_000_000 + 91_000, 5_000_000_000 + 100_100, 5_000_000_000 + 200_500])
    monkeypatch.setattr(time, "perf_counter_ns", lambda: next(monotonic))
    monkeypatch.setattr(time, "time_ns", lambda: next(realtime))
    assert raw_socket._RealtimeToPerfCounter.offset() == 5_000_000_000
    converter = raw_socket._RealtimeToPerfCounter()
    monkeypatch.setattr(raw_socket._RealtimeToPerfCounter, "offset", classmethod(lambda cls: 5_000_000_000))
    stamp = 5_000_123_456
    ancillary = [(1, 35, struct.pack("qq", stamp // 1_000_000_000, stamp % 1_000_000_000))]
    assert converter.stamp(ancillary) == 123_456


@pytest.mark.parametrize("read_path", READ_PATHS)
@pytest.mark.parametrize("framing", [b"zz\r\n", b"5\r\nabcdeXX", b"5\r\nabcde\r\n0\r\n\rX"],
                         ids=["bad-size", "no-crlf-after-data", "bad-trailer-end"])
def test_malformed_chunked_framing_is_a_protocol_error(read_path, framing):
    async def main():
        bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n" + framing + b"\r\n\r\n"
        server, port, _ = await _serve([bad], None)
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        with pytest.raises(ResponseError) as failed:
            await client.request("POST", "/x", b"", sink=_line_sink([]), timeout=5)
        assert failed.value.kind == "protocol" and failed.value.received
        assert "malformed HTTP response" in str(failed.value)
        server.close()
        server, port, _ = await _serve([b"SSH-2.0-OpenSSH_9.6\r\n\r\n"], None)  # not HTTP at all
        client = _client(f"http://127.0.0.1:{port}", {}, read_path)
        with pytest.raises(ResponseError) as failed:
            await client.request("POST", "/x", b"", sink=_line_sink([]), timeout=5)
        assert failed.value.kind == "reset" and failed.value.received
        server.close()

    asyncio.run(main())


_HEAD_OK = b"HTTP/1.1 200 OK\r\n"
_CHUNKED_HEAD = _HEAD_OK + b"Transfer-Encoding: chunked\r\n\r\n"

_RESPONSES = {
    "chunked": _CHUNKED_HEAD + _chunked(SSE, [7, 40, 1, 90, 33, 200]),
    "extensions-trailer": (_CHUNKED_HEAD + b"1e;a=b\r\ndata: {\"n\": 1}\n\ndata: {\"n\": 2}\r\n"
                           b"8;q=\"x\\\"y\";f;=\r\ndata: a\n\r\n0\r\nX-T: 1\r\n\r\n"),
    "length": _HEAD_OK + b"Content-Length: %d\r\n\r\n" % len(SSE) + SSE,
    "until-close": _HEAD_OK + b"Connection: close\r\n\r\n" + SSE + b"data: cut",
    "error-status": b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(b"no\nroom", [3, 4]),
    "empty": _HEAD_OK + b"Content-Length: 0\r\n\r\n",
    "bad-chunk": _CHUNKED_HEAD + b"8\r\ndata: a\n\r\nq\r\n",
    "cut": _CHUNKED_HEAD + _chunked(SSE, [30, 30])[:70],
    "leading-crlf": b"\r\n" + _HEAD_OK + b"Content-Length: 8\r\n\r\ndata: a\n",
    "leading-lf-not-http": b"\nTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\ndata: a\n",
    "extension-control-byte": _CHUNKED_HEAD + b"8;a\nb\r\ndata: a\n\r\n0\r\n\r\n",
    "extension-bad-quoting": _CHUNKED_HEAD + b"8;q=x\"y\r\ndata: a\n\r\n0\r\n\r\n",
    "bare-lf-trailer": _CHUNKED_HEAD + b"8\r\ndata: a\n\r\n0\r\n\n",
    "bytes-after-the-end": (_HEAD_OK + b"Content-Length: 8\r\n\r\ndata: a\n"
                            + _HEAD_OK + b"X-Next: 1\r\nContent-Length: 8\r\n\r\ndata: b\n"),
    "not-chunked-last": _HEAD_OK + b"Transfer-Encoding: chunked, gzip\r\n\r\n8\r\ndata: a\n",
    "length-past-63-bits": _HEAD_OK + b"Content-Length: 9223372036854775808\r\n\r\ndata: a\n",
}


def _socket_reader(conn: connection.Connection, lost):
    """A compiled reader for `conn` on one end of a socket pair: (its readable, that end, the other)."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    raw_socket.enable_rx_timestamps(ours)
    conn.reader = readpath._readpath.Reader(ours.fileno(), conn, lost)
    return conn.reader.readable, ours, theirs


def _sink_into(got: list, conn: connection.Connection):
    return lambda pieces, stamps, counts: got.extend(zip(pieces, stamps))


def _exchange(reads: list[bytes | None], compiled: bool, starts: frozenset[int] = frozenset({0}),
              sink_for=_sink_into):
    """Reads (None: the server closes) of one connection, a request started before each read
    whose index is in `starts`, its sink made by `sink_for(got, connection)`. Returns, per request, what its
    sink got -- each piece with the read its stamp falls in and the read that produced it -- and
    how it ended."""
    loop = asyncio.new_event_loop()
    conn = connection.Connection()
    conn.connection_made(HandTransport(conn))
    requests: list[tuple[list, asyncio.Future]] = []
    windows, made = [], []  # per read: (perf_counter_ns before it is sent, after it is read); pieces so far
    if compiled:
        readable, ours, theirs = _socket_reader(conn, conn.connection_lost)
    for number, data in enumerate(reads):
        if number in starts:
            requests.append(([], loop.create_future()))
            conn.start(b"", sink_for(requests[-1][0], conn), requests[-1][1])
        before = time.perf_counter_ns()
        if compiled:
            if data is None:
                theirs.close()
            else:
                theirs.sendall(data)
            readable()
        elif conn.closed:
            pass  # its transport reads no more
        elif data is None:
            conn.connection_lost(None)
        else:
            conn.feed(data, time.perf_counter_ns())
        windows.append((before, time.perf_counter_ns()))
        made.append(sum(len(got) for got, _ in requests) + len(conn._pieces) + len(conn.reader or ()))
    if compiled:
        ours.close()
    results, counted = [], 0
    for got, done in requests:
        pieces = []
        for piece, stamp in got:
            stamped = next((k for k, (start, end) in enumerate(windows) if start <= stamp <= end), None)
            produced = next(k for k, total in enumerate(made) if total > counted)
            pieces.append((piece, stamped, produced))
            counted += 1
        if not done.done():
            end: tuple = ("pending",)
        elif done.exception() is not None:
            end = (type(done.exception()).__name__, getattr(done.exception(), "kind", None))
        else:
            result = done.result()
            end = (result.status, result.headers, result.body, conn.reusable)
        results.append((pieces, end))
    loop.close()
    return results


def _read_by_hand(response: bytes, reads: list[int], compiled: bool):
    """`response` read in pieces of the given sizes (then the server closes) on one connection."""
    offsets = [sum(reads[:k]) for k in range(len(reads) + 1)]
    return _exchange([response[a:b] for a, b in zip(offsets, offsets[1:])] + [None], compiled)


@pytest.mark.parametrize("name", list(_RESPONSES))
def test_the_compiled_reader_takes_every_split_as_the_python_path_does(name):
    """Each response in two reads split at every byte, and in reads of one byte: the compiled
    reader hands the sink the same pieces, with the stamps of the same reads, and ends the same way."""
    _require("compiled")
    response = _RESPONSES[name]
    splits = [[k, len(response) - k] for k in range(1, len(response))] + [[1] * len(response)]
    for reads in splits:
        assert _read_by_hand(response, reads, True) == _read_by_hand(response, reads, False), reads



@pytest.mark.parametrize("read_path", ["compiled", "raw-socket"])
def test_bytes_after_a_responses_end_close_the_connection_and_leave_the_response_alone(read_path):
    """A second response nobody asked for (in the same read) neither replaces the finished
    response's headers nor reaches its sink: the connection closes."""
    _require(read_path)
    response = _RESPONSES["bytes-after-the-end"]
    [(pieces, end)] = _read_by_hand(response, [len(response)], read_path == "compiled")
    assert [piece for piece, *_ in pieces] == [b"data: a\n"]
    assert end == (200, {"content-length": "8"}, b"", False)

_LENGTH_A = _HEAD_OK + b"Content-Length: 8\r\n\r\ndata: a\n"
_CHUNKED_B = _CHUNKED_HEAD + b"8\r\ndata: b\n\r\n0\r\n\r\n"


@pytest.mark.parametrize("reads", [[_CHUNKED_B, b"\r\n", _LENGTH_A, None], [_CHUNKED_B + b"\r\n", _LENGTH_A, None],
                                   [_CHUNKED_B, b"\r\n" + _LENGTH_A, None], [_CHUNKED_B, b"\n", _LENGTH_A, None]],
                         ids=["crlf-alone", "crlf-after-the-end", "crlf-before-the-next", "lf-alone"])
def test_a_stray_line_end_between_kept_alive_responses_is_skipped(reads):
    """Servers may send CRLF after a body: llhttp skips it, and so does the compiled reader (in a
    read of its own it once took it for the next response's head and left that request waiting)."""
    _require("compiled")
    starts = frozenset({0, 1})
    compiled, python = _exchange(reads, True, starts), _exchange(reads, False, starts)
    assert compiled == python
    assert [end[0] for _, end in compiled] == [200, 200]


def _closing_sink(got: list, conn: connection.Connection):
    """A sink that closes its connection when the first batch comes."""
    def sink(pieces: list[bytes], stamps: list[int], counts: None) -> None:
        got.extend(zip(pieces, stamps))
        conn.transport.close()
    return sink


@pytest.mark.parametrize("closes", [False, True], ids=["whole", "sink-closes-on-its-first-batch"])
def test_more_pieces_than_a_batch_go_out_mid_body(closes):
    """A body of more than BATCH_PIECES pieces (a read each): the sink gets a batch mid-body, then
    the rest (or, when it closes the connection at the first batch, nothing more), on both read
    paths alike."""
    _require("compiled")
    lines = connection.BATCH_PIECES + 40
    reads = [_HEAD_OK + b"Content-Length: %d\r\n\r\n" % (2 * lines)] + [b"x\n"] * lines + [None]
    sink_for = _closing_sink if closes else _sink_into
    compiled, python = _exchange(reads, True, sink_for=sink_for), _exchange(reads, False, sink_for=sink_for)
    assert compiled == python
    (pieces, end), = compiled
    assert len(pieces) == (connection.BATCH_PIECES if closes else lines)
    assert end == (("ResponseError", "reset") if closes else (200, {"content-length": str(2 * lines)}, b"", False))


def test_a_read_inside_another_reads_callback_keeps_its_own_bytes():
    """A read walks its buffer while it calls into Python, where another connection may read
    (another thread, or a nested call as here): each read keeps its bytes, and configure(), which
    would replace the buffer, refuses meanwhile."""
    _require("compiled")
    loop = asyncio.new_event_loop()
    inner = connection.Connection()
    inner.connection_made(HandTransport(inner))
    inner_got: list = []
    inner.start(b"", _sink_into(inner_got, inner), loop.create_future())
    inner_readable, inner_ours, inner_theirs = _socket_reader(inner, inner.connection_lost)
    refused: list = []

    class Outer(connection.Connection):
        def take_head(self, head: bytes, now: int) -> tuple[int, int]:
            framing = super().take_head(head, now)
            inner_readable()
            try:
                clock = raw_socket._RealtimeToPerfCounter
                readpath._readpath.configure(clock.offset, clock.REFRESH_NS, raw_socket.READ_SIZE,
                                             connection.BATCH_PIECES)
            except RuntimeError as exc:
                refused.append(str(exc))
            return framing

    outer = Outer()
    outer.connection_made(HandTransport(outer))
    outer_got: list = []
    done = loop.create_future()
    outer.start(b"", _sink_into(outer_got, outer), done)
    outer_readable, outer_ours, outer_theirs = _socket_reader(outer, outer.connection_lost)
    inner_theirs.sendall(_HEAD_OK + b"Content-Length: 16\r\n\r\n" + b"Z" * 15 + b"\n")
    outer_theirs.sendall(_HEAD_OK + b"Content-Length: 8\r\n\r\ndata: a\n")
    outer_readable()
    assert [piece for piece, _ in outer_got] == [b"data: a\n"] and done.result().status == 200
    assert [piece for piece, _ in inner_got] == [b"Z" * 15 + b"\n"]
    assert refused and "read is under way" in refused[0]
    for sock in (inner_ours, inner_theirs, outer_ours, outer_theirs):
        sock.close()
    loop.close()


def test_a_read_whose_failure_cannot_be_reported_still_closes_the_connection():
    """When the connection raises while it reports a failed read, the transport's `lost` still
    runs (a socket left registered would wake a level-triggered loop again and again)."""
    _require("compiled")

    class Broken(connection.Connection):
        def take_head(self, head: bytes, now: int) -> tuple[int, int]:
            raise _SinkBroke("the head")

        def _fail_unexpected(self, exc: BaseException) -> None:
            raise _SinkBroke("the report")

    conn = Broken()
    lost: list = []
    readable, ours, theirs = _socket_reader(conn, lost.append)
    theirs.sendall(_HEAD_OK + b"Content-Length: 8\r\n\r\ndata: a\n")
    readable()
    assert [str(exc) for exc in lost] == ["the report"]
    readable()  # closed: reads nothing more
    assert len(lost) == 1
    ours.close()
    theirs.close()


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_a_connection_reset_fails_the_request_as_a_reset(read_path):
    """The server resets the connection (RST) mid-body: a reset, after what came before it."""
    async def main():
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(_CHUNKED_HEAD + b"8\r\ndata: a\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = _client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {}, read_path)
        with pytest.raises(ResponseError) as reset:
            await client.request("POST", "/x", b"", sink=_line_sink([]), timeout=5)
        assert reset.value.kind == "reset" and reset.value.received and "reset by peer" in str(reset.value)
        await client.close()
        server.close()

    asyncio.run(main())


def test_a_head_larger_than_64_kib_is_malformed_on_the_compiled_path():
    """The compiled reader keeps a head (or trailer) while it arrives, up to 64 KiB; llhttp on the
    Python path has no such bound."""
    _require("compiled")
    big = _HEAD_OK + b"X-Big: " + b"a" * (64 * 1024) + b"\r\nContent-Length: 8\r\n\r\ndata: a\n"
    trailer = _CHUNKED_HEAD + b"8\r\ndata: a\n\r\n0\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n"
    for response in (big, trailer):
        for reads in ([len(response)], [1000] * (len(response) // 1000) + [len(response) % 1000]):
            [(pieces, end)] = _read_by_hand(response, reads, True)
            assert end == ("ResponseError", "protocol")
    assert _read_by_hand(big, [len(big)], False)[0][1][0] == 200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the compiled read path is built on Linux only")
def test_a_missing_build_fails_its_tests_where_ci_requires_it(monkeypatch):
    monkeypatch.setattr(readpath, "_readpath", None)
    monkeypatch.setenv(REQUIRE_READPATH, "1")
    with pytest.raises(pytest.fail.Exception, match=REQUIRE_READPATH):
        require_compiled_reads()
    monkeypatch.setenv(REQUIRE_READPATH, "0")
    with pytest.raises(pytest.skip.Exception):
        require_compiled_reads()
