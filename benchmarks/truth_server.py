"""A streaming server with known timing for thousands of sessions with full-length prompts: the
ground truth of benchmarks/many_sessions.py.

tests/loadgen/sse_server.py runs on aiohttp, parses every body as JSON and stamps a request when
its handler runs: with bodies of hundreds of KB over thousands of connections its own CPU and
loop lag would pass for the client's. This one serves /v1/completions from raw non-blocking
sockets on uvloop. It never parses a prompt: it reads `max_tokens` from the start of the body,
where loadgen writes it, and only counts the rest. It stamps a request's arrival with the
kernel's receive time of its first bytes (SO_TIMESTAMPNS, put on the perf_counter_ns clock by
loadgen's own rule in loadgen/transport/raw_socket.py), so a late loop here delays its writes, which
it stamps, but not the arrival it measures from. (The kernel keeps the newest stamp of segments
that queue together, so a late read of a request still arriving stamps it late, never early: a
TTFT error measured against these records can be made larger by it, not smaller.)

Timing: the first chunk `--first-ms` after the body is complete, then one chunk `--itl-ms` after
each write, `--tokens-per-chunk` tokens each (with `token_ids`); usage and [DONE] go in the last
chunk's write. /v1/models answers like a foreign server's (no context limit). `--processes N`
forks N serving processes, each with its own SO_REUSEPORT socket on the one port (the kernel
spreads the connections over them evenly).

Records: on SIGTERM each process writes `server-<pid>.json` into `--records DIR` and exits:
{"fields": RECORD_FIELDS, "rows": [one list per answered request]}, times perf_counter_ns:
  id           the request's X-Request-Id
  arrived_ns   kernel receive stamp of the read that brought the request's first bytes
  noticed_ns   when this process read them (noticed - arrived: this server's reading lag)
  body_ns      kernel receive stamp of the read that completed the body
  body_bytes   the body's Content-Length
  max_tokens   as asked
  due_ns       when the first chunk was due (body complete + first_ms)
  write_ns     just before the first chunk's send (write - due: this server's writing lag)
  written_ns   just after it
  last_ns      just after the last chunk's send
  chunks       content chunks sent
  stalled      writes the socket could not take whole (the client was not reading)
Prints `PORT <n> PIDS <pid,...>`; runs until SIGTERM (writes the records) or SIGKILL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import signal
import socket
import sys
import time
from pathlib import Path

import orjson
import uvloop
from fast_sse_server import serving_processes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The client's own stamp conversion and socket option, so both sides' stamps follow one rule.
from loadgen.transport.raw_socket import _ANCILLARY_SIZE, _stamp, enable_rx_timestamps  # noqa: E402

RECORD_FIELDS = ("id", "arrived_ns", "noticed_ns", "body_ns", "body_bytes", "max_tokens", "due_ns", "write_ns",
                 "written_ns", "last_ns", "chunks", "stalled")
(ID, ARRIVED, NOTICED, BODY, BODY_BYTES, MAX_TOKENS, DUE, WRITE, WRITTEN, LAST, CHUNKS,
 STALLED) = range(len(RECORD_FIELDS))
READ_SIZE = 1 << 18  # bodies of hundreds of KB: a few reads each
BODY_HEAD = 256  # loadgen writes max_tokens within the body's first bytes (the prompt comes last)
MAX_TOKENS_FIELD = re.compile(rb'"max_tokens":\s*(\d+)')
MODELS = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "truth-server"}]})
MODELS_ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(MODELS)
                 + MODELS)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def content_chunk(tokens: int) -> bytes:
    """One SSE content event of `tokens` tokens, framed as an HTTP chunk."""
    choice = {"index": 0, "text": "x" * tokens, "token_ids": [7] * tokens, "finish_reason": None}
    return _chunk(b"data: " + orjson.dumps({"id": "c", "object": "text_completion", "choices": [choice]}) + b"\n\n")


def stream_end(tokens: int) -> bytes:
    usage = {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}
    event = orjson.dumps({"id": "c", "object": "text_completion", "choices": [], "usage": usage})
    return _chunk(b"data: " + event + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class Timing:
    """How this server answers: the delays and the chunk of a full `tokens_per_chunk`, encoded once."""

    def __init__(self, first_ms: float, itl_ms: float, tokens_per_chunk: int) -> None:
        self.first_s = first_ms / 1e3
        self.itl_s = itl_ms / 1e3
        self.per_chunk = tokens_per_chunk
        self.full_chunk = content_chunk(tokens_per_chunk)


class Conn:
    """One client connection: reads a request (head, then Content-Length bytes of body), then
    streams its answer on timers; loadgen sends the next request only after the answer."""

    __slots__ = ("sock", "fd", "loop", "timing", "records", "head", "need", "body_head", "rec", "left", "sent",
                 "pending", "timer", "closed")

    def __init__(self, sock: socket.socket, timing: Timing, records: list[list]) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.loop = asyncio.get_running_loop()
        self.timing = timing
        self.records = records
        self.head = bytearray()
        self.need = 0  # body bytes still to come
        self.body_head = b""
        self.rec: list | None = None  # the request being read or answered
        self.left = 0  # tokens still to send
        self.sent = 0
        self.pending: bytearray | None = None  # bytes the socket has not taken yet
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.loop.add_reader(self.fd, self.readable)

    def readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(READ_SIZE, _ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        self.feed(data, _stamp(ancillary), time.perf_counter_ns())

    def feed(self, data: bytes, stamp: int, now: int) -> None:
        if self.need:
            self.body(data, stamp, now)
            return
        if self.rec is None:
            self.rec = [None, stamp, now, None, 0, 0, None, None, None, None, 0, 0]
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            return
        request_line, *fields = bytes(self.head[:end]).split(b"\r\n")
        rest = bytes(self.head[end + 4:])
        self.head.clear()
        if request_line.startswith(b"GET "):  # the model list; anything else (loadgen asks for /metrics) is absent
            self.rec = None
            self.write(MODELS_ANSWER if request_line.startswith(b"GET /v1/models") else NOT_FOUND)
            return
        rec = self.rec
        for field in fields:
            name, _, value = field.partition(b":")
            name = name.lower()
            if name == b"content-length":
                rec[BODY_BYTES] = self.need = int(value)
            elif name == b"x-request-id":
                rec[ID] = value.strip().decode("latin-1")
        self.body_head = b""
        if rest or not self.need:
            self.body(rest, stamp, now)

    def body(self, data: bytes, stamp: int, now: int) -> None:
        if len(self.body_head) < BODY_HEAD:
            self.body_head += data[:BODY_HEAD - len(self.body_head)]
        self.need -= len(data)  # loadgen never pipelines: nothing follows a body before its answer
        if self.need > 0:
            return
        self.need = 0
        rec = self.rec
        assert rec is not None, "a body without a head"
        rec[BODY] = stamp
        match = MAX_TOKENS_FIELD.search(self.body_head)
        rec[MAX_TOKENS] = self.left = int(match.group(1)) if match else 16
        self.sent = 0
        rec[DUE] = now + int(self.timing.first_s * 1e9)
        self.timer = self.loop.call_later(self.timing.first_s, self.next_chunk)

    def next_chunk(self) -> None:
        rec = self.rec
        if self.closed or rec is None:
            return
        timing = self.timing
        tokens = min(timing.per_chunk, self.left)
        data = timing.full_chunk if tokens == timing.per_chunk else content_chunk(tokens)
        first = rec[WRITE] is None
        if first:
            data = STREAM_HEAD + data
        self.left -= tokens
        self.sent += tokens
        if not self.left:
            data += stream_end(self.sent)
        before = time.perf_counter_ns()
        self.write(data)
        after = time.perf_counter_ns()
        if first:
            rec[WRITE], rec[WRITTEN] = before, after
        rec[CHUNKS] += 1
        if self.left:
            self.timer = self.loop.call_later(timing.itl_s, self.next_chunk)
            return
        rec[LAST] = after
        self.records.append(rec)
        self.rec, self.timer = None, None

    def write(self, data: bytes) -> None:
        if self.pending is not None:
            self.pending += data
            if self.rec is not None:
                self.rec[STALLED] += 1
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.close()
            return
        if sent < len(data):
            self.pending = bytearray(data[sent:])
            if self.rec is not None:
                self.rec[STALLED] += 1
            self.loop.add_writer(self.fd, self.writable)

    def writable(self) -> None:
        assert self.pending is not None, "the writer is registered only while output is pending"
        try:
            sent = self.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        del self.pending[:sent]
        if not self.pending:
            self.pending = None
            self.loop.remove_writer(self.fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        self.loop.remove_reader(self.fd)
        if self.pending is not None:
            self.loop.remove_writer(self.fd)
        self.sock.close()


async def serve(sock: socket.socket, timing: Timing, records_dir: Path | None) -> None:
    loop = asyncio.get_running_loop()
    records: list[list] = []
    stopped = loop.create_future()
    sock.listen(4096)
    sock.setblocking(False)

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            enable_rx_timestamps(conn)
            Conn(conn, timing, records)

    loop.add_reader(sock.fileno(), accept)
    loop.add_signal_handler(signal.SIGTERM, lambda: stopped.done() or stopped.set_result(None))
    await stopped
    if records_dir is not None:
        path = records_dir / f"server-{os.getpid()}.json"
        partial = path.with_suffix(".part")  # renamed when whole: the reader waits for the final name
        partial.write_bytes(orjson.dumps({"fields": RECORD_FIELDS, "rows": records}))
        partial.rename(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1, help="serving processes (default %(default)s)")
    parser.add_argument("--first-ms", type=float, default=50.0, help="body complete to first chunk (%(default)s)")
    parser.add_argument("--itl-ms", type=float, default=10.0, help="between chunks (%(default)s)")
    parser.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per content chunk (%(default)s)")
    parser.add_argument("--records", type=Path, help="folder for each process's records, written on SIGTERM")
    args = parser.parse_args()
    if args.processes < 1 or args.tokens_per_chunk < 1:
        parser.error("--processes and --tokens-per-chunk must be at least 1")
    # thousands of connections: a default soft limit of 1024 descriptors would refuse them
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    timing = Timing(args.first_ms, args.itl_ms, args.tokens_per_chunk)
    uvloop.run(serve(serving_processes(args.processes), timing, args.records))


if __name__ == "__main__":
    sys.exit(main())
