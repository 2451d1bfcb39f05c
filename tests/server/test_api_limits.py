"""Slow clients are bounded (--read-timeout), the default max_tokens fits the context, and sampling
fields are validated: each over real sockets against a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.server.conftest import REPO, ServerProcess, start_server

READ_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory, "limits", ["--read-timeout", str(READ_TIMEOUT_S)])
    yield proc
    proc.stop()
    assert proc.proc.returncode == 0, proc.log()


def _connect(server: ServerProcess) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(0.1)
    return sock


def _trickle_until_closed(sock: socket.socket, pieces: list[bytes], limit_s: float) -> tuple[float, bytes]:
    """Send one piece every 0.2 s (then keep waiting) until the server closes the socket; returns
    (seconds it stayed open, what the server sent)."""
    start = time.monotonic()
    received = b""
    pending = list(pieces)
    while time.monotonic() - start < limit_s:
        if pending:
            try:
                sock.sendall(pending.pop(0))
            except OSError:
                break
        try:
            data = sock.recv(65536)
        except TimeoutError:
            time.sleep(0.1)
            continue
        except OSError:
            break
        if not data:
            break
        received += data
    return time.monotonic() - start, received


def test_a_request_head_that_trickles_in_is_cut_off(limited_server):
    sock = _connect(limited_server)
    head = [b"POST /v1/completions HTTP/1.1\r\n", b"Host: x\r\n"] + [b"X-Slow-%d: y\r\n" % i for i in range(40)]
    with sock:
        open_s, received = _trickle_until_closed(sock, head, limit_s=8.0)
    # Still sending header lines every 0.2 s when the server closed the connection at ~1 s.
    assert open_s < 4.0, f"slow-header socket held open for {open_s:.1f} s"
    assert received == b""
    status, health, _ = asyncio.run(limited_server.request("GET", "/health"))
    assert status == 200 and health["status"] == "ok"


def test_a_body_that_trickles_in_gets_408(limited_server):
    sock = _connect(limited_server)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n")
    with sock:
        open_s, received = _trickle_until_closed(sock, [head] + [b" "] * 40, limit_s=8.0)
    assert open_s < 4.0, f"slow-body socket held open for {open_s:.1f} s: {received[:300]!r}"
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b'"code":"request_timeout"' in received and b"--read-timeout" in received


def test_an_idle_connection_is_closed_after_the_read_timeout(limited_server):
    with _connect(limited_server) as sock:
        open_s, received = _trickle_until_closed(sock, [], limit_s=8.0)
    assert open_s < 4.0 and received == b""


def test_default_max_tokens_shrinks_to_the_room_left(limited_server):
    max_model_len = 1024
    prompt = [65] * (max_model_len - 1)
    status, body = asyncio.run(limited_server.post("/v1/completions", {"prompt": prompt}))
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 1 and body["choices"][0]["finish_reason"] == "length"
    status, body = asyncio.run(limited_server.post("/v1/completions", {"prompt": [65] * max_model_len}))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "prompt" and "no room to generate" in body["error"]["message"]
    status, body = asyncio.run(limited_server.post("/v1/completions", {"prompt": prompt, "max_tokens": 2}))
    assert status == 400 and body["error"]["param"] == "max_tokens"  # a sent max_tokens is never truncated


def test_sampling_fields_are_validated_and_unknown_ones_named(limited_server):
    status, body = asyncio.run(limited_server.post("/v1/completions", {"prompt": "x", "top_k": -5}))
    assert status == 400 and body["error"]["param"] == "top_k" and body["error"]["code"] == "invalid_value"
    status, body = asyncio.run(limited_server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "min_p": 0.5}))
    assert status == 400 and body["error"]["param"] == "min_p" and body["error"]["code"] == "unsupported_option"
    status, body, headers = asyncio.run(limited_server.request("POST", "/v1/completions", {
        "prompt": "x", "max_tokens": 2, "top_k": -1, "mirostat": 2, "typo_max_tokens": 9}))
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    assert headers["X-Ignored-Fields"] == "mirostat, typo_max_tokens"
    events_headers = asyncio.run(_stream_headers(limited_server, {"prompt": "x", "max_tokens": 2, "foo": 1}))
    assert events_headers["X-Ignored-Fields"] == "foo"


async def _stream_headers(server: ServerProcess, body: dict) -> dict[str, str]:
    async with server.session() as session, session.post(server.url + "/v1/completions",
                                                         json={**body, "stream": True}) as resp:
        await resp.read()
        return dict(resp.headers)


def test_read_timeout_flag_is_checked():
    bad = subprocess.run([sys.executable, "-m", "server.cli", "start", "--read-timeout", "0"], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120,
                         check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("server start: error: --read-timeout: must be > 0")
