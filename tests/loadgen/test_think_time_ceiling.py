"""benchmarks/think_time_ceiling.py runs end to end at a small scale (two lanes, a 3 s window,
think times scaled down so that requests fall in it) and prints one row per seed, its JSON line
consistent with the table (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def test_think_time_ceiling_smoke():
    args = ["--seeds", "0,1", "--conc", "2", "--duration", "3", "--think-time-scale", "0.001"]
    done = subprocess.run([sys.executable, "benchmarks/think_time_ceiling.py", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "conc 2, window 3 s" in lines[0] and "think-time scale 0.001" in lines[0]
    doc = json.loads(lines[-1])
    assert list(doc["rows"]) == ["0", "1"]
    for seed, row in doc["rows"].items():
        assert row["requests"] > 0 and row["errors"] == 0
        assert row["tok_s_gpu"] == pytest.approx(row["output_tokens"] / 3, rel=0.01)
        assert lines[2 + int(seed)].split() == [seed, str(row["requests"]), "0", str(row["output_tokens"]),
                                                f"{row['tok_s_gpu']:.1f}"]


def test_a_failed_replay_fails_the_script():
    done = subprocess.run([sys.executable, "benchmarks/think_time_ceiling.py", "--seeds", "0", "--warmup", "x"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--warmup" in done.stderr and "a replay failed" in done.stderr
