"""`loadgen replay --url` against `server start --model tiny` with scaled bundled traces: the two
halves work together with zero errors, and the server's counts agree with the client's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]


def test_replay_bundled_traces_against_our_server(fresh_server, tmp_path):
    out = tmp_path / "replay"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "loadgen.cli", "replay", "--url", fresh_server.url,
         "--max-context", "1024", "--token-scale", "0.02", "--think-time-scale", "0.01",
         "--duration", "4", "--conc", "2", "--out", str(out), "--quiet"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    result = orjson.loads((out / "result.json").read_bytes())
    (level,) = result["levels"]
    counts = level["counts"]
    assert not level["failed"], level["fail_reasons"]
    assert counts["errors_total"] == 0 and counts["errors"] == {}
    assert counts["requests_ok"] > 0
    assert counts["usage_mismatch_requests"] == 0  # streamed token ids match usage exactly
    assert fresh_server.proc.poll() is None, fresh_server.log()
