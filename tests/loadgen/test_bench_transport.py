"""The in-process transport against the real tiny engine on CPU: a streamed request, a refusal,
a timeout that aborts the request inside the engine, and an engine that raises mid-run (a fault
planted in the real engine's model runner, as the HTTP tests kill a real server process).

The scenarios run in a child process (this file run as a script), so that torch and the
engine's process-wide thread setting stay out of the pytest process the other loadgen tests
share; the tests check what the child reports.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadgen.transport.base import ErrorKind, Exchange, WireRequest
from loadgen.transport.inprocess import InProcessTransport
from server.config import CacheConfig, EngineConfig, SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report() -> dict:
    done = subprocess.run([sys.executable, __file__], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def test_streams_every_token_with_times_and_usage(report):
    info, ex, again = report["info"], report["ok"], report["ok_again"]
    assert info["ours"] and info["model"] == "tiny" and info["max_model_len"] == 1024 and info["vocab_size"] == 1024
    assert info["num_gpus"] is None and info["device"] == "cpu"  # per-GPU throughput counts 1 on CPU
    assert ex["error"] is None, ex["error_detail"]
    assert sum(ex["chunk_tokens"]) == ex["output_tokens"] == 6 and ex["usage_prompt_tokens"] == 100
    chunks = ex["chunk_ns"]
    assert ex["start_ns"] < chunks[0] and chunks == sorted(chunks) and ex["end_ns"] == chunks[-1]
    assert again["cached_tokens"] >= 96  # the same prompt again: its full blocks come from the prefix cache


def test_refusal_and_timeout_abort(report):
    too_long, slow, after = report["too_long"], report["slow"], report["after"]
    assert too_long["error"] == ErrorKind.ENGINE_REFUSED and "context length 1024" in too_long["error_detail"]
    assert slow["error"] == ErrorKind.TIMEOUT and slow["output_tokens"] < 900
    assert after["error"] is None and after["output_tokens"] == 3
    assert report["engine_idle_after_timeout"]  # the timed-out request was aborted inside the engine


def test_engine_crash_fails_in_flight_then_refuses(report):
    in_flight, later = report["crash"], report["later"]
    assert in_flight["error"] == ErrorKind.ENGINE_DEAD and "planted fault" in in_flight["error_detail"]
    assert later["error"] == ErrorKind.CONNECT and "planted fault" in later["error_detail"]
    assert "the in-process engine died" in report["stderr"] and "RuntimeError: planted fault" in report["stderr"]


# -- the child process ---------------------------------------------------------------------------


def _request(rid: str, n_in: int, n_out: int) -> WireRequest:
    return WireRequest(rid, np.arange(n_in, dtype=np.int32) % 256, n_out)


def _fields(ex: Exchange) -> dict:
    return {"error": ex.error, "error_detail": ex.error_detail, "start_ns": ex.start_ns, "end_ns": ex.end_ns,
            "chunk_ns": ex.chunk_ns, "chunk_tokens": ex.chunk_tokens, "output_tokens": ex.output_tokens,
            "usage_prompt_tokens": ex.usage_prompt_tokens, "cached_tokens": ex.cached_tokens}


async def _scenarios(transport: InProcessTransport) -> dict:
    out: dict = {}
    await transport.open(8)
    info = await transport.server_info()
    out["info"] = {"ours": info.ours, "model": info.model, "max_model_len": info.max_model_len,
                   "vocab_size": info.vocab_size, "num_gpus": info.num_gpus, "device": info.raw["device"]}
    out["ok"] = _fields(await transport.send(_request("ok", 100, 6)))
    out["ok_again"] = _fields(await transport.send(_request("ok-again", 100, 6)))
    out["too_long"] = _fields(await transport.send(_request("long", 1100, 4)))
    transport.timeout_s = 0.3
    out["slow"] = _fields(await transport.send(_request("slow", 100, 900)))
    transport.timeout_s = 60.0
    out["after"] = _fields(await transport.send(_request("after", 50, 3)))
    await transport.close()  # joins the step thread: the engine may be read from here
    engine = transport.engine
    engine.check_invariants()
    out["engine_idle_after_timeout"] = not engine.seqs and engine.blocks.num_in_use == 0

    def planted_fault(*args, **kwargs):
        raise RuntimeError("planted fault in the model runner")

    await transport.open(8)
    engine.runner.execute = planted_fault
    out["crash"] = _fields(await transport.send(_request("crash", 60, 4)))
    out["later"] = _fields(await transport.send(_request("later", 60, 4)))
    await transport.close()
    return out


if __name__ == "__main__":
    config = EngineConfig(device="cpu", cache=CacheConfig(num_blocks=256),
                          scheduler=SchedulerConfig(max_model_len=1024))
    transport = InProcessTransport(config, timeout_s=60.0)
    try:
        print(json.dumps(asyncio.run(_scenarios(transport))))
    finally:
        transport.shutdown()
