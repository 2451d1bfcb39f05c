"""The floor of client overhead: a bare uvloop streaming client, for benchmarks/client_overhead.py.

It does only what any streaming benchmark client must: keep N connections busy in a closed loop
(one request after another per connection, keep-alive), stamp each read with perf_counter_ns
in uvloop's `data_received`, and notice content events and the response's end. No JSON parsing,
no histograms, no per-request file: whatever loadgen spends beyond this is its own overhead.

    run_bare(url, conc, osl, warmup_s, duration_s) -> {"cpu_s", "sys_s", "window_s", "preempted", "tokens", "records"}
"""

from __future__ import annotations

import asyncio
import resource
import time
from urllib.parse import urlsplit

import orjson
import uvloop

CONTENT = b'"choices":[{'  # orjson's spelling of a content event's choices; the usage event has []
END = b"0\r\n\r\n"  # the last chunk of a chunked body


class _Stream(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport = None
        self.done: asyncio.Future | None = None
        self.first = self.last = 0
        self.events = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def start(self, request: bytes, done: asyncio.Future) -> None:
        self.done, self.first, self.last, self.events = done, 0, 0, 0
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        events = data.count(CONTENT)
        if events:
            self.events += events
            self.last = now
            if not self.first:
                self.first = now
        if data.endswith(END) and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("closed"))


def _request(host: str, port: int, request_id: str, osl: int) -> bytes:
    body = orjson.dumps({"model": "m", "prompt": list(range(256)), "max_tokens": osl, "min_tokens": osl,
                         "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"X-Request-Id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def _lane(host: str, port: int, lane: int, osl: int, until_ns: int, window: list[int],
                records: list[dict]) -> None:
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(_Stream, host, port)
    number = 0
    while time.perf_counter_ns() < until_ns:
        request_id = f"bare-{lane}-{number}"
        number += 1
        done = loop.create_future()
        start = time.perf_counter_ns()
        stream.start(_request(host, port, request_id, osl), done)
        await done
        if window[0] <= start < window[1]:
            records.append({"id": request_id, "start_ns": start, "first_ns": stream.first, "last_ns": stream.last,
                            "tokens": stream.events})
    stream.transport.close()


async def _run(url: str, conc: int, osl: int, warmup_s: float, duration_s: float) -> dict:
    parts = urlsplit(url)
    now = time.perf_counter_ns()
    window = [now + int(warmup_s * 1e9), now + int((warmup_s + duration_s) * 1e9)]
    records: list[dict] = []
    lanes = [asyncio.ensure_future(_lane(parts.hostname, parts.port, i, osl, window[1], window, records))
             for i in range(conc)]
    await asyncio.sleep(warmup_s)
    before = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*lanes)  # the window, then the drain of the requests it started
    after = resource.getrusage(resource.RUSAGE_SELF)  # the same span as loadgen's client.cpu_s
    return {"cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "sys_s": after.ru_stime - before.ru_stime, "window_s": duration_s,
            "preempted": after.ru_nivcsw - before.ru_nivcsw,
            "tokens": sum(r["tokens"] for r in records), "records": records}


def run_bare(url: str, conc: int, osl: int, warmup_s: float, duration_s: float) -> dict:
    return uvloop.run(_run(url, conc, osl, warmup_s, duration_s))
