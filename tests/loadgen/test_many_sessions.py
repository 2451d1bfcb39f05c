"""benchmarks/many_sessions.py runs end to end at a small scale (four lanes, a 2 s window, one
and two client worker processes, think times and chunk gaps short so that requests fall in the
window and the drain is short): every window request is matched to the truth server's record,
the build probe reports from the worker processes too, and each table row says what its JSON row
says (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def test_many_sessions_smoke(tmp_path):
    out = tmp_path / "many.json"
    args = ["--conc", "4", "--workers", "1,2", "--duration", "2", "--warmup", "1", "--think-time-cap", "0.2",
            "--itl-ms", "1", "--server-processes", "2", "--json", str(out)]
    done = subprocess.run([sys.executable, "benchmarks/many_sessions.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(row["conc"], row["workers"]) for row in rows] == [(4, 1), (4, 2)]
    table = [line for line in done.stdout.splitlines() if line.startswith("| 4 |")]
    assert len(table) == 2
    for row, line in zip(rows, table):
        assert row["exit"] == 0 and row["errors"] == {} and row["requests"] > 0
        assert row["matched"] == row["requests"]  # every window request found in the server's records
        assert row["ttft_err_ms_p99"] is not None and row["body_kb_p50"] > 10  # full-length prompts
        assert row["requests_built"] >= row["requests"]  # the warm-up's too, in whichever process built them
        assert row["prompt_ms_per_request"] > 0 and row["body_ms_per_request"] > 0
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[1] == f"{row['workers']} (`{row['workers_flag']}`)" and cells[2] == str(row["requests"])
        assert cells[4].startswith(f"{row['ttft_err_ms_p50']:,.3f} / {row['ttft_err_ms_p99']:,.3f}")


def test_a_failed_replay_fails_the_script():
    done = subprocess.run([sys.executable, "benchmarks/many_sessions.py", "--conc", "4", "--workers", "x",
                           "--duration", "1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--workers" in done.stderr and "wrote no results" in done.stderr
