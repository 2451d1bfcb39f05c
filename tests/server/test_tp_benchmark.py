"""benchmarks/tp.py runs end to end in its CPU smoke mode (tiny model, TP 1 and 2 over gloo, a
short loadgen replay against each) and prints one row per TP size (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def test_tp_benchmark_smoke(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "benchmarks/tp.py", "--smoke", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    rows = orjson.loads(out.read_bytes())
    assert [(r["tp"], r["gpus"]) for r in rows] == [(1, 0), (2, 0)]
    for r in rows:
        assert r["decode_step_ms"] > 0 and r["requests_ok"] > 0 and r["errors"] == 0
    table = done.stdout.splitlines()
    assert table[1].startswith("TP | GPUs | decode step ms")
    assert [line.split(" | ")[0] for line in table[3:]] == ["1", "2"]
