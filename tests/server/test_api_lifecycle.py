"""Overload, engine death and graceful shutdown, each against its own real server process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

LONG = {"prompt": "a long one", "max_tokens": 60, "ignore_eos": True}
REPO = Path(__file__).resolve().parents[2]


async def _wait_in_flight(server, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, health, _ = await server.request("GET", "/health")
        if health["requests_in_flight"] >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never saw {n} requests in flight")


async def _stream_raw(server, body: dict, started: asyncio.Event | None = None) -> list[bytes]:
    """Every SSE data line of a streamed request, raw, until the server ends the response;
    `started` is set at the first one."""
    lines = []
    async with server.session() as session:
        async with session.post(server.url + "/v1/completions",
                                data=orjson.dumps({**body, "stream": True})) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: "):
                    lines.append(line[6:].strip())
                    if started is not None:
                        started.set()
    return lines


def _tokens(lines: list[bytes]) -> int:
    return sum(len(orjson.loads(x)["choices"][0]["token_ids"]) for x in lines if x != b"[DONE]")


def test_overload_is_503_with_retry_after_and_loses_nothing(small_server):
    async def go():
        accepted = [asyncio.create_task(_stream_raw(small_server, LONG)) for _ in range(2)]
        await _wait_in_flight(small_server, 2)
        status, body, headers = await small_server.request("POST", "/v1/completions", LONG)
        return status, body, headers, await asyncio.gather(*accepted)

    status, body, headers, accepted = asyncio.run(go())
    assert status == 503
    assert body["error"]["code"] == "overloaded" and body["error"]["type"] == "server_error"
    assert int(headers["Retry-After"]) >= 1
    for lines in accepted:  # both accepted requests ran to the end
        assert lines[-1] == b"[DONE]" and _tokens(lines) == 60
    status, body = asyncio.run(small_server.post("/v1/completions", {"prompt": "x", "max_tokens": 2}))
    assert status == 200, body


def test_served_model_name(small_server):
    status, models, _ = asyncio.run(small_server.request("GET", "/v1/models"))
    assert status == 200 and [m["id"] for m in models["data"]] == ["agent-tiny"]
    assert models["data"][0]["root"] == "tiny"
    status, body = asyncio.run(small_server.post("/v1/completions", {"model": "agent-tiny", "prompt": "x",
                                                                     "max_tokens": 2}))
    assert status == 200 and body["model"] == "agent-tiny"
    status, body = asyncio.run(small_server.post("/v1/completions", {"model": "tiny", "prompt": "x"}))
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_engine_death_is_503_and_the_server_exits_nonzero(small_server):
    async def go():
        started = asyncio.Event()
        streaming = asyncio.create_task(_stream_raw(small_server, {**LONG, "max_tokens": 900}, started))
        await started.wait()  # mid-stream when the engine dies
        queued = asyncio.create_task(small_server.request("POST", "/v1/completions",
                                                          {**LONG, "max_tokens": 900}))
        await _wait_in_flight(small_server, 2)
        os.kill(small_server.engine_pid, signal.SIGKILL)
        status, body, _ = await queued
        health_status, health, _ = await small_server.request("GET", "/health")
        return status, body, health_status, health, await streaming

    status, body, health_status, health, lines = asyncio.run(go())
    assert status == 503 and body["error"]["code"] == "engine_dead"
    assert "SIGKILL" in body["error"]["message"]
    assert health_status == 503 and health["status"] == "engine_dead"
    assert lines[-1] != b"[DONE]"  # the stream ends with an error event, not a clean finish
    assert orjson.loads(lines[-1])["error"]["code"] == "engine_dead"
    assert small_server.proc.wait(60) == 1
    assert "engine process was killed by signal SIGKILL" in small_server.log()


def test_sigterm_finishes_running_requests_then_exits_zero(fresh_server):
    async def go():
        running = [asyncio.create_task(_stream_raw(fresh_server, LONG)) for _ in range(2)]
        await _wait_in_flight(fresh_server, 2)
        fresh_server.proc.send_signal(signal.SIGTERM)
        return await asyncio.gather(*running)

    for lines in asyncio.run(go()):
        assert lines[-1] == b"[DONE]" and _tokens(lines) == 60
    assert fresh_server.proc.wait(60) == 0
    log = fresh_server.log()
    assert "received SIGTERM" in log and "stopped (exit code 0)" in log
    with pytest.raises(ProcessLookupError):
        os.kill(fresh_server.engine_pid, 0)  # the engine process is gone too


def test_cli_help_and_bad_flags():
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)

    assert cli("--help").returncode == 0
    helped = cli("start", "--help")
    assert helped.returncode == 0
    for flag in ("--host", "--port", "--api-key", "--max-body-mb", "--max-queue",
                 "--served-model-name", "--shutdown-timeout", "--model", "--kv-cache-gb"):
        assert flag in helped.stdout
    for args, flag in ((["--max-queue", "-1"], "--max-queue"), (["--port", "70000"], "--port"),
                       (["--max-body-mb", "0"], "--max-body-mb"),
                       (["--block-size", "10", "--device", "cpu"], "--block-size")):
        bad = cli("start", *args)
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr.startswith("server start: error: " + flag), bad.stderr
    # Refused by the engine process itself while building the KV pool: same plain error.
    tiny_pool = cli("start", "--device", "cpu", "--port", "0", "--kv-cache-gb", "0.0000001")
    assert tiny_pool.returncode == 2, tiny_pool.stderr
    assert tiny_pool.stderr.startswith("server start: error: engine failed to start: --kv-cache-gb")
    assert "Traceback" not in tiny_pool.stderr
