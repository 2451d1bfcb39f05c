"""Shutdown keeps its promise: one drain, one deadline, cut streams end cleanly, exit code says so.

Each test ends its own real server process (tests/server/conftest.py). Stream bodies are read with
aiohttp, which raises ClientPayloadError on a chunked body that ends without its last chunk, so a
stream that reads to its end was ended properly.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import orjson
import pytest

from tests.server.conftest import ServerProcess, start_server

LONG = {"prompt": "a long one", "max_tokens": 900, "ignore_eos": True}  # ~10 s on the tiny CPU model


@pytest.fixture
def draining_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory, "drain", ["--shutdown-timeout", "3"])
    yield proc
    proc.stop()


async def _stream_events(server: ServerProcess, started: asyncio.Event) -> tuple[list, float]:
    """Every SSE payload of one long streamed request, and when its body ended (monotonic)."""
    events: list = []
    async with server.session() as session, session.post(server.url + "/v1/completions",
                                                         data=orjson.dumps({**LONG, "stream": True})) as resp:
        assert resp.status == 200
        async for line in resp.content:  # raises if the chunked body is cut short
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
                started.set()
    return events, time.monotonic()


async def _wait_in_flight(server: ServerProcess, n: int) -> None:
    for _ in range(3000):
        _, health, _ = await server.request("GET", "/health")
        if health["requests_in_flight"] >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never saw {n} requests in flight")


def _assert_cut_cleanly(events: list, why: str) -> None:
    assert events[-1] == "[DONE]", events[-3:]
    error = events[-2]["error"]
    assert error["code"] == "server_shutdown" and why in error["message"]
    assert all("choices" in e for e in events[:-2])  # tokens up to the cut


def test_deadline_cuts_running_requests_cleanly_and_exits_3(draining_server):
    server = draining_server

    async def go():
        started = [asyncio.Event() for _ in range(2)]
        streams = [asyncio.create_task(_stream_events(server, s)) for s in started]
        whole = asyncio.create_task(server.request("POST", "/v1/completions", LONG))
        for s in started:
            await s.wait()
        await _wait_in_flight(server, 3)
        server.proc.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()
        await asyncio.sleep(0.5)
        during = await server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
        health = await server.request("GET", "/health")
        return sigterm, during, health, await whole, await asyncio.gather(*streams)

    sigterm, during, health, whole, streams = asyncio.run(go())
    assert during[0] == 503 and during[1]["error"]["code"] == "shutting_down"  # refused, not reset
    assert health[0] == 503 and health[1]["status"] == "shutting_down"
    assert whole[0] == 503 and whole[1]["error"]["code"] == "server_shutdown"
    for events, ended in streams:
        _assert_cut_cleanly(events, "cut at the --shutdown-timeout deadline (3 s)")
        # One deadline: cut at --shutdown-timeout (3 s), not at twice it.
        assert 2.9 <= ended - sigterm < 5.5, ended - sigterm
    assert server.proc.wait(30) == 3
    log = server.log()
    assert "3 running requests were cut at the shutdown deadline" in log and "stopped (exit code 3)" in log


def test_second_signal_cuts_at_once(tmp_path_factory):
    server = start_server(tmp_path_factory, "patient", ["--shutdown-timeout", "600"])
    try:
        async def go():
            started = asyncio.Event()
            stream = asyncio.create_task(_stream_events(server, started))
            await started.wait()
            server.proc.send_signal(signal.SIGINT)
            await asyncio.sleep(0.3)
            server.proc.send_signal(signal.SIGINT)
            second = time.monotonic()
            events, ended = await stream
            return events, ended - second

        events, after_second = asyncio.run(go())
        _assert_cut_cleanly(events, "cut at a second signal")
        assert after_second < 5, after_second  # not the 600 s deadline
        assert server.proc.wait(30) == 3
        log = server.log()
        assert "received SIGINT again; cutting running requests now" in log
        assert "1 running requests were cut at a second signal" in log
    finally:
        server.stop()
