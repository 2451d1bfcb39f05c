"""Fixtures for loadgen tests: a real streaming server process and small trace files."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

SERVER = Path(__file__).with_name("sse_server.py")


class ServerProcess:
    """The sse_server.py process on 127.0.0.1; `records()` fetches what it saw."""

    def __init__(self, config: dict, cpu: int | None = None) -> None:
        pin = ["--cpu", str(cpu)] if cpu is not None else []
        self.proc = subprocess.Popen([sys.executable, str(SERVER), "--config", json.dumps(config), *pin],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"test server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def records(self) -> dict:
        with urllib.request.urlopen(self.url + "/_records", timeout=30) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def start_server():
    servers: list[ServerProcess] = []

    def start(**config) -> ServerProcess:
        server = ServerProcess(config)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def request_item(t: float, n_in: int, n_out: int, think: float, first_id: int, block: int = 64) -> dict:
    """One request in the agentic session schema; hash ids continue the conversation's prefix."""
    return {"t": t, "type": "n", "model": "m", "in": n_in, "out": n_out,
            "hash_ids": list(range(first_id, first_id + n_in // block)),
            "think_time": think, "api_time": 0.1, "input_types": ["text"], "output_types": ["text"]}


def write_session(path: Path, sid: str, n_requests: int, think: float, n_out: int = 8,
                  subagent: dict | None = None, base_in: int = 200) -> Path:
    """A gzip session file: `n_requests` growing requests, optionally one subagent after the 2nd."""
    items = [request_item(i * (think + 0.1), base_in + 70 * i, n_out, think if i else 0.0, 1)
             for i in range(n_requests)]
    if subagent is not None:
        items.insert(2, subagent)
    doc = {"id": sid, "models": ["m"], "block_size": 64, "hash_id_scope": "local",
           "tool_tokens": 0, "system_tokens": 0, "requests": items}
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        json.dump(doc, handle)
    return path


def subagent_item(t: float, n_requests: int, think: float, duration_s: float, n_out: int = 8) -> dict:
    return {"t": t, "type": "subagent", "agent_id": "agent_x", "subagent_type": "Explore",
            "duration_ms": duration_s * 1000, "total_tokens": 1, "tool_use_count": 1, "status": "completed",
            "requests": [request_item(i * (think + 0.1), 150 + 64 * i, n_out, think if i else 0.0, 10_000)
                         for i in range(n_requests)]}


REQUIRE_READPATH = "AGENTLOAD_REQUIRE_READPATH"  # =1: tests of the compiled read path fail where it is not built


def require_compiled_reads() -> None:
    """Skip a test of the compiled read path (loadgen/transport/_readpath.c) where it is not built
    or is stale (readpath.READ_PATH_VERSION), or fail it on Linux with AGENTLOAD_REQUIRE_READPATH=1
    (.ci/run sets it: a build that failed must not pass as skipped tests)."""
    from loadgen.transport import readpath

    if readpath._readpath is not None:
        return
    message = "the compiled read path is not built, or built from an older source (pip install -e . with a C compiler)"
    if os.environ.get(REQUIRE_READPATH) == "1" and sys.platform.startswith("linux"):
        pytest.fail(f"{message}, and {REQUIRE_READPATH}=1 requires it")
    pytest.skip(message)


@pytest.fixture(params=["compiled", "python"])
def read_path(request, monkeypatch) -> str:
    """Plain-http reads through the compiled reader (loadgen/transport/_readpath.c) or the Python
    path: the tests that take this fixture run on both, so a bug in either fails them."""
    from loadgen.transport import readpath

    if request.param == "compiled":
        require_compiled_reads()
    if request.param == "python":
        monkeypatch.setattr(readpath, "_readpath", None)
    return request.param


@pytest.fixture
def replay(tmp_path):
    """Run `loadgen replay --quiet` in-process; returns (exit code, results doc, per-request records)."""
    from loadgen.cli import main
    from loadgen.results.file import read_results

    runs = iter(range(1000))

    def run(url: str, *flags: str) -> tuple[int, dict, list[dict]]:
        out = tmp_path / f"run{next(runs)}"
        per_request = out / "requests.jsonl"
        code = main(["replay", "--url", url, "--out", str(out), "--per-request", str(per_request),
                     "--quiet", *flags])
        doc = read_results(out / "result.json")
        records = [json.loads(line) for line in per_request.read_text().splitlines()] if per_request.exists() else []
        return code, doc, records

    return run


@pytest.fixture
def sessions(tmp_path):
    """Factory: write_session(...) into a fresh traces folder; returns that folder's path."""
    folder = tmp_path / "traces"

    def make(*shapes: dict) -> Path:
        """Each shape: write_session's keywords; "subagent" holds subagent_item's keywords."""
        for i, shape in enumerate(shapes):
            shape = dict(shape)
            if "subagent" in shape:
                shape["subagent"] = subagent_item(**shape["subagent"])
            write_session(folder / f"s{i}.json.gz", shape.pop("sid", f"s{i}"), **shape)
        return folder

    return make


@pytest.fixture
def replay_cli_error(capsys, tmp_path):
    """Run `loadgen replay` expecting it to stop early; returns (exit code, stderr)."""
    from loadgen.cli import main

    def run(*flags: str) -> tuple[int, str]:
        code = main(["replay", "--out", str(tmp_path / "out"), "--quiet", *flags])
        return code, capsys.readouterr().err

    return run


def write_recipe(tmp_path: Path, doc: dict) -> Path:
    """A recipe document as tmp_path/recipe.yaml."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def processes_with(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (our own test process excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def sse_server_command(prelude: str, **config) -> str:
    """A recipe's server.command that runs the Python statements `prelude`, then sse_server.py with
    `config` and the recipe's port ({port})."""
    code = (f"{prelude}; import runpy, sys; sys.argv = [{str(SERVER)!r}] + sys.argv[1:]; "
            f"runpy.run_path(sys.argv[0], run_name='__main__')")
    settings = json.dumps({"port": 0, **config}).replace('"port": 0', '"port": {port}')
    return f"{sys.executable} -c \"{code}\" --config '{settings}'"


class HandTransport:
    """A connection's transport for driving its reads by hand (test_wire, test_token_count):
    writes go nowhere, closing it loses the connection."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        if not self.conn.closed:
            self.conn.connection_lost(None)
