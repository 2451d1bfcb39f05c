"""A minimal zero-delay streaming server for client-scaling runs (benchmarks/client_overhead.py --scaling).

tests/loadgen/sse_server.py runs on aiohttp and spends more CPU per token than the client under
test, so with two client workers on a 2-core machine it, not the client, would set the pace.
This one answers /v1/completions on raw uvloop protocols: it reads `max_tokens` from the body
and writes that many pre-encoded SSE events (one token each, one write each: the client still
sees one event per read when it keeps up), then usage and [DONE]. /v1/models answers like a
foreign server's. `--processes N` forks N serving processes, each with its own listening socket on
the one port (SO_REUSEPORT: the kernel spreads the connections over them evenly, where one shared
socket would let the first process to wake take most of a burst). One process tops out near 300k
tokens/s on one core: a client with two workers can outrun it.
Prints `PORT <n> PIDS <pid,...>`; runs until killed (kill the process group: the forks too).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import sys

import orjson
import uvloop

EVENT = b"data: " + orjson.dumps({"id": "c", "object": "text_completion",
                                  "choices": [{"index": 0, "text": "x", "token_ids": [7], "finish_reason": None}]}) + b"\n\n"
CHUNK = b"%x\r\n" % len(EVENT) + EVENT + b"\r\n"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
MODELS = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "bench"}]})
MAX_TOKENS = re.compile(rb'"max_tokens":(\d+)')
LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


class Handler(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            match = LENGTH.search(head)
            size = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + size:
                return
            body = self.buffer[end + 4:end + 4 + size]
            self.buffer = self.buffer[end + 4 + size:]
            self._answer(head, body)

    def _answer(self, head: bytes, body: bytes) -> None:
        write = self.transport.write
        if head.startswith(b"GET /v1/models"):
            write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(MODELS)
                  + MODELS)
            return
        match = MAX_TOKENS.search(body)
        tokens = int(match.group(1)) if match else 16
        write(HEAD)
        for _ in range(tokens):
            write(CHUNK)
        usage = orjson.dumps({"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": tokens}})
        write(_chunk(b"data: " + usage + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


async def serve(sock: socket.socket) -> None:
    server = await asyncio.get_running_loop().create_server(Handler, sock=sock, backlog=1024)
    await server.serve_forever()


def listening_socket(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def serving_processes(processes: int) -> socket.socket:
    """Forks `processes` - 1 more serving processes, each with a listening socket of its own on one
    port; the first prints `PORT <n> PIDS <pid,...>`. Returns the calling process's socket."""
    sock = listening_socket(0)
    port = sock.getsockname()[1]
    pids = [os.getpid()]
    for _ in range(processes - 1):
        pid = os.fork()
        if pid == 0:
            sock.close()
            return listening_socket(port)
        pids.append(pid)
    print(f"PORT {port} PIDS {','.join(map(str, pids))}", flush=True)
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1, help="serving processes (default 1)")
    args = parser.parse_args()
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    uvloop.run(serve(serving_processes(args.processes)))


if __name__ == "__main__":
    sys.exit(main())
