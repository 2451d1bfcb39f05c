"""Fixtures for the server tests: a real `server start` subprocess on 127.0.0.1 and HTTP helpers.

Servers bind port 0 and announce their URL and engine pid on the `ready` line of stderr, which
goes to a log file the tests read for exit reasons. There is no pytest-asyncio: tests wrap their
coroutines in `asyncio.run`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from server.config import API_KEY_ENV
from tests.torch_threads import one_torch_thread  # noqa: F401  (autouse: the in-process engine tests)

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key"
STARTUP_TIMEOUT_S = 180.0
TINY = ["--model", "tiny", "--device", "cpu", "--max-model-len", "1024"]
_READY = re.compile(r"ready at (http://\S+) \(model (\S+), engine pid (\d+)\)")


class ServerProcess:
    """A running `server start` subprocess and async HTTP helpers against it."""

    def __init__(self, args: list[str], log_path: Path, api_key: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # A key in the caller's environment would guard every server started without one.
        inherited = {name: value for name, value in os.environ.items() if name != API_KEY_ENV}
        env = dict(inherited, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **(env or {}))
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "server.cli", "start", "--port", "0", *args],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        self.url, self.model, self.engine_pid = self._wait_ready()

    def _wait_ready(self) -> tuple[str, str, int]:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            match = _READY.search(self.log())
            if match:
                url = match.group(1)
                with urllib.request.urlopen(url + "/health", timeout=30) as response:
                    assert response.status == 200
                return url, match.group(2), int(match.group(3))
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode} before ready:\n{self.log()}")
            time.sleep(0.1)
        self.proc.kill()
        pytest.fail(f"server not ready after {STARTUP_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=self.headers, timeout=aiohttp.ClientTimeout(total=300))

    async def request(self, method: str, path: str, body: Any = None, *, data: bytes | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
        """(status, parsed JSON body or text, headers)."""
        if body is not None:
            data = orjson.dumps(body)
        async with self.session() as session:
            async with session.request(method, self.url + path, data=data, headers=headers) as resp:
                raw = await resp.read()
                is_json = resp.content_type == "application/json"
                return resp.status, orjson.loads(raw) if is_json else raw.decode(), dict(resp.headers)

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        status, parsed, _ = await self.request("POST", path, body)
        return status, parsed

    async def stream(self, path: str, body: dict[str, Any]) -> list[Any]:
        """POST with stream=true; every SSE data payload in order ("[DONE]" kept as a string)."""
        events: list[Any] = []
        async with self.session() as session:
            async with session.post(self.url + path, data=orjson.dumps({**body, "stream": True})) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.content_type == "text/event-stream"
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        payload = line[6:].strip()
                        events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
        return events

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text, _ = await self.request("GET", "/metrics")
        assert status == 200
        return parse_prometheus_text(text)

    async def metric(self, name: str) -> float:
        """The value of an unlabelled-but-for-model_name sample."""
        return (await self.metrics())[(name, (("model_name", self.model),))]


def parse_prometheus_text(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Strict parser for the text format: {(name, sorted label pairs): value}."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    typed: set[str] = set()
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram")
            typed.add(name)
            continue
        if line.startswith("# HELP "):
            continue
        match = line_re.match(line)
        assert match, f"bad exposition line: {line!r}"
        name, raw_labels, value = match.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or family in typed, f"sample before its # TYPE line: {line!r}"
        labels = tuple(sorted(label_re.findall(raw_labels or "")))
        key = (name, labels)
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = float(value)
    return samples


@pytest.fixture
def parse_prometheus():
    return parse_prometheus_text


def start_server(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str],
                 api_key: str | None = None) -> ServerProcess:
    log = tmp_path_factory.mktemp(name) / "server.log"
    key_args = ["--api-key", api_key] if api_key else []
    return ServerProcess([*TINY, *key_args, *args], log, api_key)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The shared server: tiny model, API key set, a small KV pool (43 blocks of 16 tokens)
    so that concurrency forces queueing and preemption."""
    proc = start_server(tmp_path_factory, "main", ["--kv-cache-gb", "0.0005", "--max-num-seqs", "16",
                                                   "--max-num-batched-tokens", "256",
                                                   "--max-body-mb", "1"], API_KEY)
    yield proc
    proc.stop()
    assert proc.proc.returncode == 0, proc.log()


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One running request at a time and one waiting (--max-num-seqs 1 --max-queue 1), so a
    third request in flight is refused. Its last test kills the engine, so no exit-code check."""
    proc = start_server(tmp_path_factory, "small", ["--max-num-seqs", "1", "--max-queue", "1",
                                                    "--served-model-name", "agent-tiny"])
    yield proc
    proc.stop()


@pytest.fixture
def fresh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own, for a test that ends it."""
    proc = start_server(tmp_path_factory, "fresh", [])
    yield proc
    proc.stop()
