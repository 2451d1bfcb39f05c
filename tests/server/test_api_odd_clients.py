"""Clients that send what well-behaved ones do not, and API keys kept off the command line.

Control characters and huge names among unknown fields, an Authorization header that is not
UTF-8, a request followed by a half-close, malformed HTTP, temperatures and top_p too small for
float32, bad `server start` flags: each gets a proper answer from a real server on 127.0.0.1
(over raw sockets where an HTTP client library would refuse or repair what is sent).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from server.config import API_KEY_ENV
from server.protocol import MAX_IGNORED_NAMES
from tests.server.conftest import REPO, TINY, ServerProcess

ENV_KEY = "key-from-the-environment"


@pytest.fixture(scope="module")
def env_key_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose API key comes from $AGENTLOAD_API_KEY."""
    proc = ServerProcess(TINY, tmp_path_factory.mktemp("env-key") / "server.log", ENV_KEY, env={API_KEY_ENV: ENV_KEY})
    yield proc
    proc.stop()
    assert proc.proc.returncode == 0, proc.log()


def _exchange(server: ServerProcess, request: bytes, half_close: bool = False) -> bytes:
    """Send `request` on a fresh connection (then shutdown(SHUT_WR) if `half_close`); everything
    received until the server closes."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while data := sock.recv(65536):
            received += data
    return received


def _post(path: str, body: bytes, version: str = "1.1", authorization: bytes = b"Bearer " + ENV_KEY.encode()) -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode() + b"Authorization: " + authorization + b"\r\n\r\n" + body


def _split(response: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a raw response; the headers' values as latin-1 text."""
    assert response, "the server closed the connection without a response"
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split(" ")[1]), headers, body


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_field_names_are_escaped_and_bounded_in_the_header(env_key_server, stream):
    names = ["a\r\nb", "b\u00e9,\\", "c d\U0001f600", "k" * 100_000, "n\x00", *(f"z{i:02d}" for i in range(30))]
    body = orjson.dumps({"prompt": "x", "max_tokens": 2, "stream": stream, **dict.fromkeys(names, 1)})
    status, headers, _ = _split(_exchange(env_key_server, _post("/v1/completions", body)))
    assert status == 200
    shown = ["a\\x0d\\x0ab", "b\\xe9\\x2c\\x5c", "c\\x20d\\U0001f600", "k" * 80 + "...", "n\\x00",
             *(f"z{i:02d}" for i in range(MAX_IGNORED_NAMES - 5))]
    assert headers["X-Ignored-Fields"] == ", ".join([*shown, f"({len(names) - MAX_IGNORED_NAMES} more)"])


def test_an_authorization_header_that_is_not_utf8_is_401(env_key_server):
    request = _post("/v1/completions", b'{"prompt": "x"}', authorization=b"Bearer \xff\xfe")
    status, _, body = _split(_exchange(env_key_server, request))
    assert status == 401 and orjson.loads(body)["error"]["code"] == "invalid_api_key"
    assert "UnicodeEncodeError" not in env_key_server.log()


@pytest.mark.parametrize("stream", [False, True])
def test_a_half_closed_http10_request_is_answered(env_key_server, stream):
    body = orjson.dumps({"prompt": "x", "max_tokens": 3, "ignore_eos": True, "stream": stream})
    status, _, answer = _split(_exchange(env_key_server, _post("/v1/completions", body, "1.0"), half_close=True))
    assert status == 200
    if stream:
        assert answer.endswith(b"data: [DONE]\n\n") and answer.count(b'"token_ids"') == 3
    else:
        assert orjson.loads(answer)["usage"]["completion_tokens"] == 3


def test_temperatures_and_top_p_too_small_for_float32_sample_greedily(env_key_server):
    base = {"prompt": "greedy", "max_tokens": 8, "ignore_eos": True}

    async def tokens(**options: float) -> list[int]:
        status, body = await env_key_server.post("/v1/completions", {**base, **options})
        assert status == 200, body
        return body["choices"][0]["token_ids"]

    greedy = asyncio.run(tokens(temperature=0))
    for options in ({"temperature": 1e-39}, {"temperature": 1e-38}, {"top_p": 1e-46}, {"top_p": 1e-46, "seed": 5}):
        assert asyncio.run(tokens(**options)) == greedy, options


@pytest.mark.parametrize("request_bytes, reason", [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "Content-Length"),
    (b"GARBAGE\r\n\r\n", "method"),
])
def test_malformed_http_gets_an_openai_error_body(env_key_server, request_bytes, reason):
    status, headers, body = _split(_exchange(env_key_server, request_bytes))
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    error = orjson.loads(body)["error"]
    assert error["code"] == "invalid_http_request" and error["type"] == "invalid_request_error"
    assert reason in error["message"]


def _rejected(server: ServerProcess) -> dict[str, int]:
    """agentload:requests_rejected_total by code, read from the server's /metrics."""
    text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
    return {code: int(float(value)) for code, value in
            re.findall(r'^agentload:requests_rejected_total\{[^}]*code="([^"]+)"\} (\S+)$', text, re.M)}


def _reset_mid_body(server: ServerProcess) -> None:
    """Send a head and part of its body, then reset the connection (SO_LINGER 0: an RST, not a FIN)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(_post("/v1/completions", b'{"prompt": "' + b"x" * 1000 + b'"}')[:-900])
    time.sleep(0.3)  # the handler is reading the body
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_parser_errors_and_resets_mid_body_are_counted_without_tracebacks(env_key_server):
    before = _rejected(env_key_server)
    _exchange(env_key_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
    _reset_mid_body(env_key_server)
    deadline = time.monotonic() + 30
    while (after := _rejected(env_key_server)).get("client_gone", 0) == before.get("client_gone", 0):
        assert time.monotonic() < deadline, f"the reset was not counted: {after}"
        time.sleep(0.1)
    assert after.get("invalid_http_request", 0) - before.get("invalid_http_request", 0) == 1, (before, after)
    assert after["client_gone"] - before.get("client_gone", 0) == 1, (before, after)
    log = env_key_server.log()
    assert "Traceback" not in log, log[-3000:]
    assert "refused a request from 127.0.0.1: malformed HTTP request: Invalid character in Content-Length" in log


async def _models_status(server: ServerProcess, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.get(server.url + "/v1/models", headers=headers) as resp:
        return resp.status


def test_api_key_from_the_environment_stays_off_the_command_line(env_key_server):
    assert asyncio.run(_models_status(env_key_server, None)) == 401
    assert asyncio.run(_models_status(env_key_server, ENV_KEY)) == 200
    assert ENV_KEY.encode() not in Path(f"/proc/{env_key_server.proc.pid}/cmdline").read_bytes()


def test_api_key_from_a_file_wins_over_the_environment(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("key-from-a-file\n")
    server = ServerProcess([*TINY, "--api-key-file", str(key_file)], tmp_path / "server.log",
                           env={API_KEY_ENV: ENV_KEY})
    try:
        assert asyncio.run(_models_status(server, "key-from-a-file")) == 200
        assert asyncio.run(_models_status(server, ENV_KEY)) == 401
    finally:
        server.stop()


def _start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "server.cli", "start", "--device", "cpu", "--port", "0", *args],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_max_body_mb_must_be_a_finite_positive_number(value):
    bad = _start("--max-body-mb", value)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr == f"server start: error: --max-body-mb: must be a positive number, got {float(value)}\n"


@pytest.mark.parametrize("contents, args, error", [
    ("k\n", ["--api-key", "k"], "--api-key-file: give it or --api-key, not both"),
    (None, [], "--api-key-file: cannot read"),
    ("\n", [], "must hold the key on one line"),
    ("one\ntwo\n", [], "must hold the key on one line"),
])
def test_api_key_file_is_checked(tmp_path, contents, args, error):
    key_file = tmp_path / "key"
    if contents is not None:
        key_file.write_text(contents)
    bad = _start("--api-key-file", str(key_file), *args)
    assert bad.returncode == 2 and bad.stderr.startswith("server start: error: --api-key-file: "), bad.stderr
    assert error in bad.stderr
