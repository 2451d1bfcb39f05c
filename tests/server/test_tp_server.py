"""`server start --tp 2` as real processes on CPU (gloo): completions, /v1/models, a full
`loadgen replay` with zero errors, a killed or hung rank ending the server non-zero with the
reason, the second-node launcher (`python -m server.parallel`) on loopback, and flag errors."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from server.config import ParallelConfig
from server.distributed.settings import STEP_TIMEOUT_ENV
from server.engine.model_runner import ModelRunner
from server.parallel.launcher import main as parallel_main
from tests.server.conftest import TINY, ServerProcess, start_server
from tests.server.engine_fixtures import tiny_config
from tests.server.test_api_lifecycle import LONG, _stream_raw, _wait_in_flight

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
EXIT_WAIT_S = 60.0
_WORKER = re.compile(r"tensor-parallel rank 1 started \(pid (\d+)\)")


def worker_pid(server: ServerProcess) -> int:
    match = _WORKER.search(server.log())
    assert match, server.log()
    return int(match.group(1))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def tp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory, "tp2", ["--tp", "2"])
    yield proc
    pid = worker_pid(proc)
    proc.stop()
    assert proc.proc.returncode == 0, proc.log()
    assert not pid_alive(pid), "the worker rank outlived the server"


def test_completions_and_models(tp_server):
    async def go():
        body = {"prompt": "tensor parallel " * 4, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        first = await tp_server.post("/v1/completions", body)
        again = await tp_server.post("/v1/completions", body)
        events = await tp_server.stream("/v1/completions", body)
        models = await tp_server.request("GET", "/v1/models")
        return first, again, events, models

    (status, first), (_, again), events, (models_status, models, _) = asyncio.run(go())
    assert status == 200 and first["usage"]["completion_tokens"] == 12
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # prefix cache across ranks
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]) == first["choices"][0]["text"]
    assert models_status == 200
    assert models["data"][0]["num_gpus"] == 0  # GPUs, and these ranks run on CPU


def test_loadgen_replay_against_tp2_has_zero_errors(tp_server, tmp_path):
    out = tmp_path / "replay"
    done = subprocess.run(
        [sys.executable, "-m", "loadgen.cli", "replay", "--url", tp_server.url,
         "--max-context", "1024", "--token-scale", "0.02", "--think-time-scale", "0.01",
         "--duration", "4", "--conc", "2", "--out", str(out), "--quiet"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    (level,) = orjson.loads((out / "result.json").read_bytes())["levels"]
    counts = level["counts"]
    assert not level["failed"], level["fail_reasons"]
    assert counts["errors_total"] == 0 and counts["requests_ok"] > 0
    assert counts["usage_mismatch_requests"] == 0
    assert tp_server.proc.poll() is None, tp_server.log()


def test_killed_rank_ends_the_server_with_the_reason(tmp_path_factory):
    server = start_server(tmp_path_factory, "tp2-kill", ["--tp", "2"])
    try:
        pid = worker_pid(server)

        async def go():
            started = asyncio.Event()
            streaming = asyncio.create_task(_stream_raw(server, {**LONG, "max_tokens": 900}, started))
            await started.wait()  # mid-stream when the rank dies
            await _wait_in_flight(server, 1)
            os.kill(pid, signal.SIGKILL)
            lines = await asyncio.wait_for(streaming, EXIT_WAIT_S)
            return lines, await server.request("GET", "/health")

        lines, (health_status, health, _) = asyncio.run(go())
        reason = f"tensor-parallel rank 1 (pid {pid}) died: killed by signal SIGKILL"
        error = orjson.loads(lines[-1])["error"]
        assert error["code"] == "engine_dead" and reason in error["message"]
        assert health_status == 503 and reason in health["reason"]
        assert server.proc.wait(EXIT_WAIT_S) == 1
        assert reason in server.log()
    finally:
        server.stop()


def test_hung_rank_ends_the_server_with_the_reason(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "3")
    server = start_server(tmp_path_factory, "tp2-hang", ["--tp", "2"])
    pid = worker_pid(server)
    try:
        os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing

        async def go():
            return await server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4})

        status, body, _ = asyncio.run(go())
        assert status == 503 and body["error"]["code"] == "engine_dead"
        assert server.proc.wait(EXIT_WAIT_S) == 1
        assert f"tensor-parallel rank 1 (pid {pid}) did not answer within 3 s" in server.log()
        assert not pid_alive(pid) or _is_zombie(pid)
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        server.stop()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("launcher", ["spawn", "torchrun"])
def test_second_node_launcher_on_loopback(tmp_path, launcher):
    """--nnodes 2 with both 'nodes' on this machine: rank 1 comes from `python -m server.parallel`
    (which spawns it, or is it under torchrun) and ends cleanly when the server stops."""
    port = str(_free_port())
    flags = [*TINY, "--tp", "2", "--nnodes", "2", "--master-port", port]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    prefix = [sys.executable, "-m"] if launcher == "spawn" else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m"]
    node1 = subprocess.Popen([*prefix, "server.parallel", *flags, "--node-rank", "1"],
                             cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    server = None
    try:
        server = ServerProcess([*flags, "--node-rank", "0"], tmp_path / "server.log")
        status, body = asyncio.run(server.post("/v1/completions", {"prompt": "two nodes", "max_tokens": 5}))
        assert status == 200 and body["usage"]["completion_tokens"] == 5
        server.stop()
        assert server.proc.returncode == 0, server.log()
        assert node1.wait(EXIT_WAIT_S) == 0, node1.stdout.read()
    finally:
        if server is not None:
            server.stop()
        if node1.poll() is None:
            node1.kill()
            node1.wait()


def test_flag_errors(capsys, monkeypatch):
    assert parallel_main([*TINY, "--tp", "2"]) == 2
    assert "--node-rank at least 1" in capsys.readouterr().err
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert parallel_main([*TINY, "--tp", "2", "--nnodes", "2", "--node-rank", "1"]) == 2
    assert "LOCAL_RANK='1': must be in 0..0" in capsys.readouterr().err
    monkeypatch.delenv("LOCAL_RANK")
    config = dataclasses.replace(tiny_config(num_blocks=4),
                                 parallel=ParallelConfig(tensor_parallel_size=2, nnodes=2, node_rank=1))
    with pytest.raises(ValueError, match="`server start` is rank 0"):
        ModelRunner(config)
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=STEP_TIMEOUT_ENV):
        ModelRunner(dataclasses.replace(config, parallel=ParallelConfig(tensor_parallel_size=2)))
